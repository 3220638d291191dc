// Package backfill owns backfills: it reads the rows already in an outbox
// table, for the connector to send them as events: a poller's pending rows
// on the first start, and the rows an operator asks for with cdc backfill.
// It holds the plan (the queries), the jobs and their watermark state
// machine (Jobs: pure, events in, rows to send and checkpoint notes out),
// the runner that reads the chunks (Runner), the first start's job, and
// whether a request runs (Jobs.Admit: its signature, kept with it as a
// checkpoint.Request, its age, its table). The pipeline
// feeds it the stream's control messages and sends what it hands back.
//
// It reads by keyset pagination: chunks of rows in the order of the
// table's order_by columns plus its primary key, each chunk after the key
// of the last row of the one before. The key is kept as text, so a job
// resumes from a checkpoint after a crash, and memory holds one chunk.
// Rows are read in Postgres' text format on a connection with the
// replication connection's output settings (postgres.ConnectRows), so that
// decode.RowDecoder turns them into the same events their INSERTs would
// have been.
//
// Invariants:
//
//   - Every key column is NOT NULL and the key is unique (it ends with the
//     primary key): a row compares greater than the last key exactly when
//     it was not read yet, so keyset pagination neither skips nor repeats
//     a row.
//
//   - Plan checks the condition and the columns with the server before
//     anything is read or sent: a condition that does not parse, or a
//     column that does not exist, is a one-line error.
//
//   - Reads are read-only transactions: a condition cannot write.
//
//   - The first start's job reads in the snapshot the slot exported, and
//     is sent before the stream's first transaction, in transactions that end
//     at the slot's consistent point (docs/design.md, "Backfill consistency").
//
//   - A read in an older snapshot (the first start's, a repair's) first
//     locks the table and fails, to be tried again, when the table was
//     rewritten, created again or had a partition attached or detached
//     since the snapshot: none of these is MVCC-safe, and such a snapshot
//     would read fewer rows without a word (TestRewriteAfterTheSnapshot,
//     TestPartitionsChangedAfterTheSnapshot). A chunk beside the stream
//     runs in READ COMMITTED, so that one that waited behind a rewrite
//     reads the rewritten table (TestChunkAfterARewrite).
//
//   - Any other job reads each chunk between a low and a high watermark,
//     logical decoding messages it writes (the DBLog approach). The chunk is
//     sent at the high watermark, in its transaction, less the rows the stream
//     met between the watermarks: a chunk neither overtakes nor doubles the
//     live events around it (TestWatermarksSendWhatTheStreamDidNot), and its
//     progress is part of the watermark's checkpoint, so a restart goes on from
//     the last chunk Kafka acknowledged.
//
//   - A watermark or a failure names the session's random run, which only
//     logical decoding can read; a request runs only when its signature
//     verifies with checkpoint.signing_key_file (TestAdmitChecksTheSignature,
//     docs/design.md, "Untrusted input stays data").
package backfill
