BEGIN;
INSERT INTO outbox VALUES ('5d0c6f8a-0000-4000-8000-000000000001', 'order', 'o-1', 'OrderCreated', '{"customerId": "c-7", "region": "EU-West", "total": 10}', 'acme');
INSERT INTO outbox VALUES ('5d0c6f8a-0000-4000-8000-000000000002', 'order', 'o-9', 'OrderCreated', '{"customerId": "c-7", "region": "EU-West", "total": 1}', 'test');
COMMIT;
INSERT INTO outbox VALUES ('5d0c6f8a-0000-4000-8000-000000000003', 'order', 'o-2', 'OrderCreated', '{"customerId": "c-7", "total": 5}', NULL);
INSERT INTO outbox VALUES ('5d0c6f8a-0000-4000-8000-000000000004', 'customer', 'c-9', 'CustomerRegistered', '{"name": "Zoë"}', 'acme');
