INSERT INTO tenant."OutboxEvent" (id, "tenantId", "eventType", "aggregateType", "aggregateId", payload, "createdAt")
VALUES ('ckz1a2b3c0000qwerty12345', 'acme', 'kitchen.task.claimed', 'KitchenTask', 'task-42', '{"claimedBy": "chef-1"}', '2026-11-22 09:30:00.125');
-- claimedBy must be a string: this one is dead-lettered with the reason.
INSERT INTO tenant."OutboxEvent" (id, "tenantId", "eventType", "aggregateType", "aggregateId", payload, "createdAt")
VALUES ('ckz1a2b3c0001qwerty12345', 'acme', 'kitchen.task.claimed', 'KitchenTask', 'task-43', '{"claimedBy": 7}', '2026-11-22 09:31:00.000');
INSERT INTO tenant."OutboxEvent" (id, "tenantId", "eventType", "aggregateType", "aggregateId", payload, "createdAt")
VALUES ('ckz1a2b3c0002qwerty12345', 'acme', 'kitchen.task.claimed', 'KitchenTask', 'task-44', '{"claimedBy": "chef-2", "station": "grill"}', '2026-11-22 09:32:00.000');
