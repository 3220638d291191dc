// Package park holds back an aggregate whose event cannot be delivered,
// not the pipeline and not its order (docs/operations.md, "Parked keys";
// docs/design.md, "Parked keys"): with a table's on_invalid: park, an
// invalid event parks its key, and it and every later event of the same
// key go to the table's parked topic, in commit order, while every other
// key streams on; cdc redrive (package redrive) sends them on, in order,
// once the cause is fixed.
//
// Invariants:
//   - A key is parked at most once per pipeline (Set is keyed by the
//     record key), whatever the table, topic or cause of its events: an
//     event whose topic cannot be worked out could be meant for any, and
//     two parkings of one key would be released out of order.
//   - A parked event is never dropped: it is produced to the parked topic,
//     tracked like any event, so its transaction is confirmed only once
//     Kafka acknowledged the parked copy; what is parked is part of the
//     checkpoint (checkpoint.Record.Parked) at the position it belongs
//     to, so a restart, a takeover and exactly-once mode keep it.
//   - What the checkpoint says of a parking is checkable against the
//     topic: its records go to one partition from an offset read when it
//     began, each numbered (Number) by the session's run that produced it
//     (checkpoint.Parked.Runs), and sealed (Seal) with the signing key,
//     so that a record missing, forged, or produced by a session whose
//     checkpoint never counted it is told apart.
//   - At most max_parked_keys keys are parked, in at most their share of
//     the checkpoint record in bytes; one more stops the pipeline with
//     the error on_invalid: fail gives.
//   - A redrive request names the parkings the operator saw (key and
//     episode), is signed like a backfill request, and is admitted by
//     package request, once.
package park
