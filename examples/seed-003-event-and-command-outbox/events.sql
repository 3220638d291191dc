BEGIN;
INSERT INTO event_outbox (aggregate_type, aggregate_id, event_type, payload, correlation_ids, created_at)
VALUES ('Lead', 'aaaaaaaa-0000-4000-8000-000000000001', 'LeadAddedEvent', '{"name": "Ada", "score": 0.75}', '{"request": "req-1"}', '2026-11-22 08:00:00');
INSERT INTO command_outbox (command_type, payload, created_at)
VALUES ('SendMessageCommand', '{"to": "ada@example.com"}', '2026-11-22 08:00:01');
COMMIT;
