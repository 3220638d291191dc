// Package testenv starts what integration tests need: a real PostgreSQL
// with wal_level=logical, and a Kafka-protocol broker.
//
// Postgres comes from CDC_TEST_POSTGRES_URL (an existing server, superuser
// URL), from testcontainers-go when a Docker engine answers, or from the
// local server binaries via localpg. Kafka comes from CDC_TEST_KAFKA_BROKERS,
// from testcontainers-go, or is franz-go's in-process kfake. The
// testcontainers path runs scripts/containers, a module of its own, so that
// the connector's module does not require testcontainers-go or the Docker
// client. backend.go is
// the one place that chooses; CDC_TEST_BACKEND=local|testcontainers forces
// a path, and every run prints the one it used.
//
// The Schema Registry lives in package testregistry beside this one: the
// real one CDC_TEST_REGISTRY_URL names, or franz-go's srfake served over
// HTTP; testregistry.NewFake always gives srfake, for the tests that inject
// faults. A registry that was asked for and does not answer fails the test.
//
// A missing Postgres is a test failure, not a skip: only -short skips the
// integration tests, and CI never passes it.
package testenv
