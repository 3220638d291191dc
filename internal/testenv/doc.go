// Package testenv starts what integration tests need: a real PostgreSQL
// with wal_level=logical, and a Kafka-protocol broker.
//
// Postgres comes from CDC_TEST_POSTGRES_URL (an existing server, superuser
// URL) or is started from the local server binaries (initdb, pg_ctl from
// PATH or /usr/lib/postgresql/*/bin) in a temporary directory on a free
// loopback port; as root it runs as the postgres (or nobody) user, because
// Postgres refuses to run as root. Kafka comes from CDC_TEST_KAFKA_BROKERS
// or is franz-go's in-process kfake.
//
// A missing Postgres is a test failure, not a skip: only -short skips the
// integration tests, and CI never passes it.
package testenv
