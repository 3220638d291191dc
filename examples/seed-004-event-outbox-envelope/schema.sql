-- Seed 004: event_outbox with group/subsidiary tenancy and a worker's
-- status/available_at/attempts columns.
CREATE TABLE event_outbox (
  id uuid PRIMARY KEY,
  group_id uuid NOT NULL,
  subsidiary_id uuid,
  aggregate_type text NOT NULL,
  aggregate_id uuid NOT NULL,
  event_type text NOT NULL,
  payload jsonb NOT NULL,
  status text NOT NULL DEFAULT 'pending',
  available_at timestamptz NOT NULL DEFAULT now(),
  attempts integer NOT NULL DEFAULT 0,
  created_at timestamptz NOT NULL DEFAULT now()
);
