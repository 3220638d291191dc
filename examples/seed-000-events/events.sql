INSERT INTO events (event_id, type, event_version, actor_id, actor_type, organization_id, payload, metadata, created_at)
VALUES ('00000000-0000-4000-8000-0000000000a1', 'practice.created', 2, '00000000-0000-0000-0000-000000000000', 'system',
        '11111111-1111-4111-8111-111111111111', '{"practice_id": 7}', '{"request_id": "r-1"}', '2026-11-22 10:00:00+00');
INSERT INTO events (event_id, type, actor_id, actor_type, organization_id, payload, created_at)
VALUES ('00000000-0000-4000-8000-0000000000a2', 'user.invited', '22222222-2222-4222-8222-222222222222', 'user',
        '11111111-1111-4111-8111-111111111111', '{"email": "a@b.c"}', '2026-11-22 10:00:01+00');
