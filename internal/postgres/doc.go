// Package postgres is the connector's side of the PostgreSQL server, all
// but the replication stream (package wal): the postgres.* configuration
// and ordinary connections; the checks of cdc check and of each start
// (wal_level, privileges, the outbox tables, the publication); the
// publication's set-up and the catalog it is checked against; the slot's
// state; the start lock; and the writes a hot standby sends to its
// primary.
//
// Invariants (docs/design.md, "Position rules"):
//   - Setup never creates a slot: whether a missing slot is a first start
//     or a gap is the pipeline's decision, against its checkpoint. A lost
//     slot is a *errtext.Fatal.
//   - A connection that reads rows to send as events (ConnectRows) pins
//     the output formats the replication connection pins (PinFormats), so
//     that a backfilled row and a streamed one decode to the same bytes.
//   - Nothing here writes to a standby: what must be written (the
//     publication, logical messages, retention's deletes) goes to the
//     primary (postgres.primary_url) or stops with the statement to run
//     there.
package postgres
