// Package pipeline does supervision and the session, and nothing else. It
// wires the stages together:
//
//	wal.Stream ──bytes──▶ decode.Decoder ──Event──▶ route.Router ──Record──▶ sink.Kafka
//	    ▲                                                                      │
//	    └── Confirmed() ◀── delivery.Confirmer ◀── delivery.Tracker ◀───── ack ┘
//	                        (or delivery.Committer, exactly once)
//
// One session is one replication connection, one Kafka client, one decoder, one
// tracker, and one of the two ways of confirming behind one interface
// (session.go). Every session decides, against the checkpoint, whether it may
// create the slot or must refuse a gap (start.go), under the slot's start lock
// so that replicas take turns; a first start is a state that lasts until the
// slot and its checkpoint exist, whatever failed before (docs/design.md, "A
// first start is a state, not a session"). A session ends on shutdown, on a
// fatal error, or on a transient one; transient errors start a new session
// after a backoff, and Postgres re-sends everything after the slot's confirmed
// position. An instance that finds the slot held waits as a standby and takes
// over a silent holder (postgres.Takeover).
//
// The session also carries what other packages decide: the backfill
// chunks internal/backfill hands it at their high watermarks, and the
// first start's rows (backfill.go); a replay's copy of the replay slot,
// filtered by internal/replay (replay.go). The operator commands are
// internal/ops' (Pipeline.Ops).
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
//   - A transaction whose commit the checkpoint's last delivered commit
//     covers is skipped, in both modes, only within the checkpoint's WAL
//     history (docs/design.md, "Re-delivery after a crash", "An LSN means
//     something only within its WAL history").
//   - A backfilled row goes through the same routing and tracking as a
//     streamed one. The first start's rows are each in the snapshot or in
//     the stream, not both; a chunk beside the stream is sent at its high
//     watermark, without the rows the stream met between its watermarks,
//     and its progress is checkpointed with that position
//     (docs/design.md, "Backfill consistency").
//   - Shutdown, and a stop the tables' watch asks for, stop reading between
//     two transactions (ender), wait for Kafka's acks, write the last
//     checkpoint, send a final status update with what it covers, and
//     close, within ShutdownTimeout: a graceful stop sends nothing twice.
package pipeline
