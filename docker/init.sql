-- Runs once when the compose Postgres starts with an empty volume: the
-- default outbox table (Debezium's layout) and a business table.
CREATE TABLE outbox (
  id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
  aggregatetype text NOT NULL,
  aggregateid text NOT NULL,
  type text NOT NULL,
  payload jsonb
);
CREATE TABLE orders (
  id bigserial PRIMARY KEY,
  customer text NOT NULL,
  status text NOT NULL
);
