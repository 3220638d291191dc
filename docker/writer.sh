#!/usr/bin/env bash
# The compose demo writer: once the connector holds its slot, it creates an
# order and its outbox event in one transaction every second.
set -euo pipefail
until psql -tAc "SELECT 1 FROM pg_replication_slots WHERE slot_name = 'outbox_cdc' AND active" | grep -q 1; do
  echo "writer: waiting for the connector's replication slot"
  sleep 1
done
customers=(alice bob carol dave)
i=0
while true; do
  c=${customers[$((i % 4))]}
  psql -q -v ON_ERROR_STOP=1 <<SQL
BEGIN;
WITH o AS (INSERT INTO orders (customer, status) VALUES ('$c', 'created') RETURNING id)
INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
SELECT 'order', o.id::text, 'OrderCreated', jsonb_build_object('order', o.id, 'customer', '$c') FROM o;
COMMIT;
SQL
  echo "writer: order for $c committed"
  i=$((i + 1))
  sleep 1
done
