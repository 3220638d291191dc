// Package checkpoint is a pipeline's durable position: the Record, one per
// pipeline in a compacted Kafka topic (Store), and what decides, on start,
// whether the slot may be streamed from it.
//
// A Record says how far Kafka holds the stream (the confirmed LSN, the
// database system, the slot), the backfill jobs under way, the replay
// window and its marks (position, time samples), the retention marks, and
// the history of accepted gaps and rewinds. With a signing key the
// connector signs what it writes, and a record whose signature does not
// verify is skipped, counted and logged: the last genuine record stands,
// and jobs only a forger wrote are never run. Backfill
// requests (cdc backfill) are records of their own in the same topic,
// signed (Request), which Requests follows for a running pipeline;
// package backfill decides whether one runs.
//
// Decide compares the checkpoint with the slot on start: a missing slot, a
// slot past the checkpoint, or another database system is a *GapError,
// never a first start. Which position the slot may be confirmed to, from
// Kafka's acknowledgements, is package delivery's.
package checkpoint
