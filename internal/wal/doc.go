// Package wal owns the PostgreSQL logical replication connection: it
// creates and copies slots when told to, streams pgoutput messages to a
// handler, and confirms positions to the slot. The server's set-up (the
// publication, the checks, the slot's state) is package setup's.
//
// Invariants (docs/design.md, "Position rules"):
//   - One goroutine owns the replication connection. Stream.Run receives and
//     sends on it; acknowledgements reach it only as values it reads from
//     Acks before each receive. Close runs on the same goroutine after Run.
//   - The confirmed position is Acks.Confirmed, never what was received.
//     Write, flush and apply are all set to it explicitly, because pglogrepl
//     copies the write position into zero flush/apply fields.
//   - Keepalives are handed to Acks, which alone decides whether the slot
//     may follow the server's WAL end (only with nothing open or in flight).
//   - Confirms are prompt: while Acks owes anything the loop reads
//     Confirmed every ConfirmInterval, and at once when Wake is called (a
//     checkpoint was acknowledged), and reports a move at once, at most
//     one status update per ConfirmInterval.
//   - The receive takes no context (pgconn would allocate a watcher per
//     message); the socket's read deadline wakes it, also when batched
//     records are due (Releaser), which are released only from the loop's
//     goroutine. While live, the socket's coalescing read lets the batch
//     go before it waits (Releaser.Drained): it runs inside the loop's
//     receive, because during Run only the loop reads the socket (status
//     updates are written unbuffered, so pgconn's background reader never
//     starts).
//   - Status updates go out every StatusInterval even while Acks is
//     saturated and the loop has stopped reading, so the walsender never
//     reaches wal_sender_timeout because Kafka is slow.
//   - Streaming starts at the slot's own position (LSN 0 in
//     START_REPLICATION); any other start is a deliberate operator act,
//     done by advancing a slot, never by the start LSN.
//   - Stream.End ends Run between two transactions: never after a BEGIN
//     without its COMMIT, unless the grace it is given runs out, so that a
//     stop asked for leaves nothing of a transaction in Kafka that the last
//     checkpoint does not cover.
//   - Temporary slots are made on the replication connection that streams
//     them (Conn.CopySlot), so they vanish with it however it ends.
package wal
