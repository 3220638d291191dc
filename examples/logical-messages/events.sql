BEGIN;
INSERT INTO orders VALUES ('o-9', 'created');
SELECT pg_logical_emit_message(true, 'outbox', '{"id": "m-1", "aggregate_type": "order", "aggregate_id": "o-9", "event_type": "OrderCreated", "payload": {"total": 30}, "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}');
INSERT INTO outbox VALUES ('3c000000-0000-4000-8000-000000000001', 'order', 'o-9', 'OrderAudited', '{"by": "table"}');
SELECT pg_logical_emit_message(true, 'outbox', '{"id": "m-2", "aggregate_type": "order", "aggregate_id": "o-9", "event_type": "OrderPaid", "payload": {"paid": true}}');
SELECT pg_logical_emit_message(false, 'outbox', '{"id": "ignored-non-transactional", "aggregate_type": "order", "aggregate_id": "o-9", "payload": {}}');
SELECT pg_logical_emit_message(true, 'audit', '{"id": "ignored-prefix"}');
COMMIT;
