// Package park holds back an aggregate whose event cannot be delivered,
// not the pipeline and not its order (docs/operations.md, "Parked keys";
// docs/design.md, "Parked keys"): with a table's on_invalid: park, an
// invalid event parks its key, and it and every later event of the same
// key go to the table's parked topic, in commit order, while every other
// key streams on; cdc redrive sends them on, in order, once the cause is
// fixed.
//
// Invariants:
//   - A parked key is (Dest, Key): the topic the key's events are meant
//     for and the record's key, so that tables sharing a topic and key
//     share the parking, as they share the consumer's order; an event
//     whose topic cannot be worked out parks (table, key).
//   - A parked event is never dropped: it is produced to the parked topic,
//     tracked like any event, so its transaction is confirmed only once
//     Kafka acknowledged the parked copy; what is parked is part of the
//     checkpoint (checkpoint.Record.Parked) at the position it belongs
//     to, so a restart, a takeover and exactly-once mode keep it.
//   - At most max_parked_keys keys are parked; one more stops the
//     pipeline with the error on_invalid: fail gives.
//   - A parked record carries what its redrive needs: the record it would
//     have been (behind the first) or the event it came from (the first),
//     its destination, and its parking's Episode, so that a redrive reads
//     only this parking's records, in the order they were parked.
//   - A redrive request is signed like a backfill request, and announced
//     in the WAL: it runs where the stream reaches the announcement, so
//     the key's later events come after the redriven ones.
package park
