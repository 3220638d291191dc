// Package inbox makes a Kafka consumer apply each outbox event once: it
// records the event's id in an inbox table inside the consumer's own
// database transaction, and runs the consumer's work only the first time
// that id is seen. It is the consumer half of at-least-once delivery
// (docs/consumers.md): the connector, a crash or a replay may deliver an
// event again, and the inbox turns that into one effect.
//
// Invariants:
//   - The id is inserted in the same transaction as the work. If the
//     transaction commits, the id and the effect are both there; if it rolls
//     back, neither is, and a redelivery does the work.
//   - Two consumers of one name that process the same id at the same time
//     are serialised by the table's primary key: the second waits for the
//     first's transaction, then skips (or works, if the first rolled back).
//   - Commit the Kafka offset only after the transaction has committed. A
//     crash between the two redelivers events whose ids are already in the
//     inbox, and they are skipped.
//   - Ids are kept for a retention period (Cleanup): an event redelivered
//     after its id was cleaned up is applied again. Keep ids longer than
//     anything can redeliver: the broker's retention for the topics, and the
//     connector's replay.window if replays should be skipped.
//
// The table is seed 004's event_inbox(consumer_name, event_id); Table sets
// another name.
package inbox
