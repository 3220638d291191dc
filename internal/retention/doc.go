// Package retention deletes the outbox rows whose events Kafka has
// acknowledged, once they are older than a table's retention.after: the
// clean-up a poller did and log-based CDC leaves to someone's hand-written
// job (docs/operations.md, "Retention"; docs/design.md, "Retention").
//
// A row's acknowledgement is known without a column of the row: a marker
// pairs the oldest transaction a snapshot still saw running (xmin, as a
// 64-bit xid) with the WAL insert position read after that snapshot. Every
// transaction below that xmin had ended when the snapshot was taken, so
// its commit record is before the position. Once the checkpoint Kafka
// acknowledged is past the position, every row written by a transaction
// below the xmin has been delivered, and a marker taken retention.after
// ago tells the rows that old (their transaction ended before the marker).
//
// Invariants:
//   - A row is deleted only when its writer's xid is below the xmin of a
//     marker whose WAL position the saved checkpoint has confirmed (in
//     exactly-once mode, only a committed Kafka transaction saves one),
//     and which was taken at least retention.after ago. A row updated since
//     its insert carries the updater's xid, which is newer: it waits
//     longer, never less.
//   - A table with an unfinished backfill job keeps every row: the job
//     may still have to read it.
//   - Only the replica that holds the slot runs it (the pipeline starts it
//     in a streaming session), off the replication loop, in batches of
//     retention.batch_size, each a short transaction with a lock_timeout,
//     paced between batches.
//   - drop_partitions detaches and drops a range partition only when its
//     upper bound is before the horizon and no row in it is too young or
//     unacknowledged.
package retention
