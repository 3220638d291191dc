// Package pipeline wires the stages together and supervises them:
//
//	wal.Stream ──bytes──▶ decode.Decoder ──Event──▶ route.Router ──Record──▶ sink.Kafka
//	    ▲                                                                      │
//	    └──────── Confirmed() ◀── checkpoint.Tracker ◀──────── ack ────────────┘
//
// One session is one replication connection, one Kafka client, one decoder
// and one tracker. A session ends on shutdown, on a fatal error, or on a
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
//   - Shutdown stops reading, waits for Kafka's acks up to ShutdownTimeout,
//     sends a final status update with what was acked, and closes.
package pipeline
