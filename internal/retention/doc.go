// Package retention deletes the outbox rows whose events Kafka has
// acknowledged, once they are older than a table's retention.after: the
// clean-up a poller did and log-based CDC leaves to someone's hand-written
// job (docs/operations.md, "Retention"; docs/design.md, "Retention").
//
// A row's acknowledgement is known without a column of the row: a mark
// pairs the oldest transaction a snapshot still saw running (xmin, as a
// 64-bit xid) with the WAL insert position read after that snapshot. Every
// transaction below that xmin had ended when the snapshot was taken, so
// its commit record is before the position. That the checkpoint Kafka
// acknowledged is past the position proves the row delivered only if the
// stream carried the row's table at the row's commit: keepalives move the
// confirmed position past WAL the connector never saw as events (a table
// not in the publication, a relation not repaired yet). So a delete rests
// on facts the checkpoint and the catalog state, never on the position
// alone (facts.go).
//
// Invariants:
//   - A row is deleted only when, in the transaction that deletes it and
//     under a lock that keeps DDL out: its relation is the one the saved
//     checkpoint says the stream covered (checkpoint.Table.Rel, by id),
//     published through the same membership, with inserts and no row
//     filter; its writer's xid is at or above the table's Floor and after
//     the transaction that made its partition a partition of the table;
//     and its writer's xid is below the xmin of a mark whose position the
//     saved checkpoint confirmed (in exactly-once mode, only a committed
//     Kafka transaction saves one) and which was taken at least
//     retention.after ago. A row updated since its insert carries the
//     updater's xid, which is newer: it waits longer, never less.
//   - A mark is a fact of one WAL history: it carries its timeline, the
//     checkpoint's key its database system, and a mark that does not fit
//     the server now (another timeline, an xmin above the next xid, a
//     position past the WAL's end, a time in the future) is dropped. A
//     gap accepted (cdc reset --accept-gap) drops them all.
//   - What is read back from the checkpoint topic deletes rows only when
//     signed: a table with retention needs checkpoint.signing_key_file,
//     and a record that goes back (an older one produced again) is not
//     read (checkpoint.Record.Seq).
//   - Marks are kept by age, not by count: however long retention.after,
//     a table's oldest usable mark stays, and a row goes at most one
//     mark spacing after it is that old.
//   - A table with an unfinished backfill job keeps every row: the job
//     may still have to read it.
//   - Only the replica that holds the slot runs it (the pipeline starts it
//     in a streaming session), off the replication loop, on a connection
//     opened at each sweep to the server that can write then (after a
//     promotion, never the old primary), in batches of
//     retention.batch_size, each a short transaction with a lock_timeout,
//     paced between batches.
//   - drop_partitions drops a range partition whose upper bound is at or
//     before now less retention.after, when every row in it may go, checked
//     again under the lock that detaches it, in the transaction that drops
//     it: a row written between the look and the drop keeps it.
package retention
