// Package backfill reads the rows already in an outbox table, for the
// connector to send them as events: a poller's pending rows on the first
// start, and the rows an operator asks for with cdc backfill.
//
// It reads by keyset pagination: chunks of rows in the order of the
// table's order_by columns plus its primary key, each chunk after the key
// of the last row of the one before. The key is kept as text, so a job
// resumes from a checkpoint after a crash, and memory holds one chunk.
// Rows are read in Postgres' text format on a connection with the
// replication connection's output settings (wal.ConnectRows), so that
// decode.RowDecoder turns them into the same events their INSERTs would
// have been.
//
// Invariants:
//   - Every key column is NOT NULL and the key is unique (it ends with the
//     primary key): a row compares greater than the last key exactly when
//     it was not read yet, so keyset pagination neither skips nor repeats
//     a row.
//   - Plan checks the condition and the columns with the server before
//     anything is read or sent: a condition that does not parse, or a
//     column that does not exist, is a one-line error.
//   - Reads are read-only transactions: a condition cannot write.
//
// Where the chunks go, and how they stay consistent with the live stream
// (an exported snapshot on the first start, watermarks in the WAL after),
// is the pipeline's: docs/design.md, "Backfill".
package backfill
