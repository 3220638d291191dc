-- Seed 000: an events table written in the business transaction and, until
-- now, polled by a worker (processed/processed_at/retry_count/last_error).
CREATE TABLE events (
  event_id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
  type text NOT NULL,
  event_version integer NOT NULL DEFAULT 1,
  actor_id uuid NOT NULL,
  actor_type text NOT NULL,
  organization_id uuid,
  payload jsonb NOT NULL,
  metadata jsonb,
  processed boolean NOT NULL DEFAULT false,
  processed_at timestamptz,
  retry_count integer NOT NULL DEFAULT 0,
  last_error text,
  created_at timestamptz NOT NULL DEFAULT now()
);
