// Package postgres is how the connector reaches the PostgreSQL server,
// for all but the replication stream (package wal): the postgres.*
// configuration, ordinary connections and what their errors mean, a hot
// standby's primary and the writes sent there, and the start lock. What
// the server must have before streaming is package setup's.
//
// Invariants (docs/design.md, "Position rules"):
//   - A connection that reads rows to send as events (ConnectRows) pins
//     the output formats the replication connection pins (PinFormats), so
//     that a backfilled row and a streamed one decode to the same bytes.
//   - Nothing here writes to a standby: what must be written (the
//     publication, logical messages, retention's deletes) goes to the
//     primary (postgres.primary_url) or stops with the statement to run
//     there.
package postgres
