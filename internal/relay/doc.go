// Package relay sends a session's events on to Kafka. Each event the
// decoder (or a backfill) hands it becomes a record (package route),
// checked against its schema (package schema) and sized, on a topic made
// before its first record; it is counted in the tracker of what waits for
// Kafka, in its Postgres transaction, and produced, and Kafka's answer
// lands in the tracker.
//
// Invariants (docs/design.md, "No path skips a record" and "Untrusted
// input stays data"):
//   - Nothing is skipped to keep going. An event that cannot be delivered
//     as configured (a bad routing field, a record too large, a topic the
//     brokers refuse, a payload that does not match its schema) stops the
//     session with an *outbox.EventError naming the source, the event id and
//     the LSN; or, with its source's on_invalid: park, parks its key; or,
//     with on_invalid: dead-letter, or an operator's cdc skip for that one
//     event (on a park table too), becomes a dead-letter record,
//     which is counted and tracked like any other, so that its transaction
//     is confirmed only once Kafka acknowledged the dead letter.
//   - A registry that cannot answer is not the event's problem: the event
//     waits (Sender.Blocking keeps the slot's lease) and is never
//     dead-lettered for it.
//   - One gate (gate.go): every record, whatever path made it, passes
//     admit in produce, the only call of the producer here; no row reaches
//     the checkpoint topic, and only parking's own records a parked topic;
//     a record fits its topic's limit and names a partition it has. A
//     refusal is the event's problem, as above, never the pipeline's.
//   - A parked key's events, of any table and valid or not, go behind its
//     parking, numbered and sealed (package park); the checkpoint of the
//     transaction's end counts them (NoteParked).
//   - An event its table's filter leaves out (route.ErrFiltered) is
//     counted and neither produced nor tracked: its transaction resolves
//     with the others. A record an expression pinned to a partition is
//     checked against its topic's partition count before it is produced,
//     so a partition past the end is the event's problem, not the
//     producer's.
//   - A record is counted in the tracker before it is handed to the
//     producer, so its ack can never come first.
package relay
