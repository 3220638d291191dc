-- The table-less outbox: the application calls
--   pg_logical_emit_message(true, 'outbox', '<json>')
-- inside its transaction. Nothing is written to a table, so there is no
-- vacuum and no cleanup. This example also keeps a Debezium outbox table,
-- to show both sources in one transaction keep their order.
CREATE TABLE orders (id text PRIMARY KEY, status text NOT NULL);
CREATE TABLE outbox (
  id uuid PRIMARY KEY,
  aggregatetype text NOT NULL,
  aggregateid text NOT NULL,
  type text NOT NULL,
  payload jsonb
);
