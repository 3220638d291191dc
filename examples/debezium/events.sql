BEGIN;
INSERT INTO outbox VALUES ('7b6f1c3e-0000-4000-8000-000000000001', 'order', 'o-1', 'OrderCreated', '{"total": 12.5, "lines": [{"sku": "ä-1", "qty": 2}]}');
INSERT INTO outbox VALUES ('7b6f1c3e-0000-4000-8000-000000000002', 'customer', 'c-1', 'CustomerRegistered', '{"name": "Zoë"}');
COMMIT;
INSERT INTO outbox VALUES ('7b6f1c3e-0000-4000-8000-000000000003', 'order', 'o-1', 'OrderPaid', NULL);
