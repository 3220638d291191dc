// Package sink produces records to Kafka with franz-go.
//
// Invariants (docs/design.md, "Kafka", "Same aggregate, same key, same
// partition", "No path skips a record"):
//   - The producer is idempotent with acks=all and unlimited retries, so a
//     partition's records land once and in order; franz-go's data-loss
//     detection stops the producer rather than continue past a gap.
//   - Records are never cancelled: Produce hands franz-go a context that is
//     never done, because cancelling an idempotent record after it was sent
//     would let later records overtake it.
//   - Every record gets exactly one answer through its done callback. An
//     error answer is a *ProduceError that says what to do; it is never
//     retried or skipped here. The caller decides (see pipeline).
//   - Send batches adaptively (batch.go): a record goes at once unless a
//     batch went less than MaxBatchDelay ago; then it waits for the next
//     batch, at most MaxBatchDelay; while the stream is live (Live) it
//     waits for the stream's Drained, one batch per read. Send, Release
//     and Drained run on one goroutine
//     and let records go in the order they were sent, so batching never
//     reorders; a held record has no answer yet, so nothing behind it can be
//     confirmed.
//   - With a TransactionalID (exactly-once, txn.go) every record goes inside
//     a Kafka transaction the pipeline begins and commits; batching is off.
//     A newer producer with the same id fences this one: its errors become
//     a *FencedError, and it never commits again.
package sink
