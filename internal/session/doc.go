// Package session is one replication session, from where the pipeline's
// start left it to its end (Run), and nothing else. It wires the stages
// together:
//
//	wal.Stream ──bytes──▶ decode.Decoder ──Event──▶ route.Router ──Record──▶ sink.Kafka
//	    ▲                                                                      │
//	    └── Confirmed() ◀── delivery.Confirmer ◀── delivery.Tracker ◀───── ack ┘
//	                        (or delivery.Committer, exactly once)
//
// A session is one replication connection, one Kafka client, one decoder,
// one tracker, and one of the two ways of confirming behind one interface
// (sessionAcks). Run opens it on what the pipeline's start opened (Start:
// the connection, the position, the catalog, a first start's snapshot),
// streams, with its background tasks beside the stream (the Kafka watch,
// the replay window, the tables' watch, retention, the backfills), and
// ends it; what it leaves the next session (End) and everything that
// lives across sessions (Deps: the checkpoint, the backfill jobs, the
// requests' way in) are the pipeline's. The stream hands each message to
// session.handle (session.go), which sends an event on through
// relay.Sender.
//
// The session also carries what other packages decide, in the stream's
// order: the backfill chunks internal/backfill hands it at their high
// watermarks, and the first start's rows (backfill.go); a recreated
// table's rows that internal/tablewatch read (tables.go); the operator's
// requests, backfills and redrives (redrive.go, internal/redrive); a
// replay's copy of the replay slot, filtered by internal/replay (Replay).
//
// Invariants:
//   - Nothing is ever skipped to keep going: an invalid event stops the
//     connector with an error naming the source, event id and LSN, or (with
//     on_invalid: dead-letter) becomes a dead-letter record that the tracker
//     counts like any event, so its transaction resolves only after that
//     record is acked.
//   - The slot is confirmed only up to a checkpoint Kafka has acknowledged.
//   - A transaction whose commit the checkpoint's last delivered commit
//     covers is skipped, in both modes; the pipeline's start has checked
//     that the slot is in the checkpoint's WAL history (docs/design.md,
//     "Re-delivery after a crash", "An LSN means something only within
//     its WAL history").
//   - A backfilled row goes through the same routing and tracking as a
//     streamed one. The first start's rows are each in the snapshot or in
//     the stream, not both; a chunk beside the stream is sent at its high
//     watermark, without the rows the stream met between its watermarks,
//     and its progress is checkpointed with that position
//     (docs/design.md, "Backfill consistency").
//   - A repaired table's events that the stream carries follow the rows
//     its repair's snapshot sent: the stream waits at the relation's first
//     fresh event for the snapshot, and passes over the events the
//     snapshot holds (docs/design.md, "Table changes").
//   - An operator's request runs only once request.Admit admitted it
//     (signed, fresh, not taken before), and the checkpoint that covers
//     the transaction it ran in remembers it (checkpoint.Record.Used).
//   - Shutdown, and a stop the tables' watch asks for, stop reading between
//     two transactions (session.end), wait for Kafka's acks, write the last
//     checkpoint, send a final status update with what it covers, and
//     close, within ShutdownTimeout: a graceful stop sends nothing twice.
package session
