// Package wal owns the PostgreSQL logical replication connection: it checks
// the server's preconditions, creates the publication and slot, streams
// pgoutput messages to a handler, and confirms positions to the slot.
//
// Invariants (docs/design.md, "Position rules"):
//   - One goroutine owns the replication connection. Stream.Run receives and
//     sends on it; acknowledgements reach it only as values it reads from
//     Acks before each receive. Close runs on the same goroutine after Run.
//   - The confirmed position is Acks.Confirmed, never what was received.
//     Write, flush and apply are all set to it explicitly, because pglogrepl
//     copies the write position into zero flush/apply fields.
//   - When Acks is idle (no transaction open, nothing in flight), the slot
//     may move to the WAL end of a keepalive, so a quiet outbox in a busy
//     database does not retain WAL. Never while anything is open or in flight.
//   - Status updates go out every StatusInterval even while Acks is
//     saturated and the loop has stopped reading, so the walsender never
//     reaches wal_sender_timeout because Kafka is slow.
//   - Streaming starts at the slot's own position (LSN 0 in
//     START_REPLICATION); any other start is a deliberate operator act.
//   - A missing slot is created only on the first session of a process.
//     A slot that vanishes or is lost later is a fatal error, never a reason
//     to create a new one and continue.
package wal
