INSERT INTO event_outbox (id, group_id, subsidiary_id, aggregate_type, aggregate_id, event_type, payload, created_at)
VALUES ('5f0c4e1a-0000-4000-8000-000000000001', '9a000000-0000-4000-8000-000000000001', '9b000000-0000-4000-8000-000000000002',
        'order', '0d000000-0000-4000-8000-000000000003', 'created',
        '{"order_no": "ORD-0001", "total_amount": "125000.00", "currency": "NGN"}', '2025-12-21 22:30:00+00');
