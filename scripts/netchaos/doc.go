// Package netchaos puts a network between the connector and Postgres, and
// between the connector and Kafka, and breaks it: latency, a black hole
// that drops packets without a reset, connections reset mid-request, a
// slow link (docs/operations.md, "Fault suite"). It runs the cdc binary
// against a real Postgres and a real Apache Kafka broker, each behind an
// in-process toxiproxy (github.com/Shopify/toxiproxy/v2), and counts every
// event through each fault: none lost, none out of order per aggregate,
// and, in exactly-once mode, none twice for a read_committed consumer.
//
// It is a module of its own, as scripts/containers is, so that toxiproxy
// and what it needs are no requirement of the connector's module. make
// chaos runs it (CDC_NET_FAULT sets how long a fault lasts: 60 s by
// default, 15 s in CI).
package netchaos
