// Package pipeline wires the stages together and supervises them:
//
//	wal.Stream ──bytes──▶ decode.Decoder ──Event──▶ route.Router ──Record──▶ sink.Kafka
//	    ▲                                                                      │
//	    └── Confirmed() ◀── checkpoint.Confirmer ◀── checkpoint.Tracker ◀─ ack ┘
//
// One session is one replication connection, one Kafka client, one decoder,
// one tracker and one confirmer. The first session of a process decides,
// against the checkpoint, whether it may create the slot or must refuse a
// gap (start.go); the checkpoint then lives in the Pipeline across sessions.
// Replay (replay.go) and the operator commands (admin.go) reuse the same
// pieces. A session ends on shutdown, on a fatal error, or on a
// transient one; transient errors start a new session after a backoff, and
// Postgres re-sends everything after the slot's confirmed position.
//
// Invariants:
//   - Fatal and transient errors are told apart in one place (Permanent).
//   - Nothing is ever skipped to keep going: an invalid event stops the
//     connector with an error naming the source, event id and LSN, or (with
//     on_invalid: dead-letter) becomes a dead-letter record that the tracker
//     counts like any event, so its transaction resolves only after that
//     record is acked.
//   - The slot is confirmed only up to a checkpoint Kafka has acknowledged,
//     and never moves over a gap an operator has not accepted.
//   - Shutdown stops reading, waits for Kafka's acks up to ShutdownTimeout,
//     writes the last checkpoint, sends a final status update with what it
//     covers, and closes.
package pipeline
