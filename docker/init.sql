-- Runs once when the compose Postgres starts with an empty volume, as the
-- superuser in database app: the default outbox table (Debezium's layout),
-- a business table, and what the connector needs and no more: a role with
-- REPLICATION that may read the outbox, and the publication, created here
-- by the table's owner because the connector's role does not own it
-- (docs/operations.md, "Postgres requirements").
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
CREATE ROLE cdc WITH LOGIN REPLICATION PASSWORD 'cdc';
GRANT SELECT ON outbox TO cdc;
-- Lets a standby see when the slot's holder last spoke (pg_stat_replication.reply_time),
-- so that it can take over a frozen holder (standby.takeover_after).
GRANT pg_read_all_stats TO cdc;
CREATE PUBLICATION outbox_cdc FOR TABLE outbox WITH (publish = 'insert');
