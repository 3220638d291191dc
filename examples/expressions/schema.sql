-- Debezium Outbox Event Router's layout, with a tenant column.
CREATE TABLE outbox (
  id uuid PRIMARY KEY,
  aggregatetype varchar(255) NOT NULL,
  aggregateid varchar(255) NOT NULL,
  type varchar(255) NOT NULL,
  payload jsonb,
  tenant text
);
