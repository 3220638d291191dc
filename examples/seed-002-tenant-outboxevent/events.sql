INSERT INTO tenant."OutboxEvent" (id, "tenantId", "eventType", "aggregateType", "aggregateId", payload, "createdAt")
VALUES ('ckz1a2b3c0000qwerty12345', 'acme', 'kitchen.task.claimed', 'KitchenTask', 'task-42', '{"claimedBy": "chef-1"}', '2026-11-22 09:30:00.125');
