// Package tableread reads an outbox table's rows, for a backfill or a
// repair to send them as events: the rows matching a condition, in an
// order (Order), a chunk at a time, within a byte budget. A Plan holds the
// queries, checked with the server before any row is read; it reads
// keyset chunks (Plan.Read), and, in an order of the commits, opens a
// server-side Cursor. HoldFiles checks, in an older snapshot, that the
// table is still the one the snapshot shows. Crossing tells, for reads
// of several tables merged in the order of the commits, a transaction
// whose rows in two tables carry one aggregate: their order is in no
// table (Unordered). What is read, where it is sent and how a job's
// progress is kept are package backfill's.
//
// It reads the rows in an order: backfill.order_by's (OrderColumns), when
// the operator declared one, by keyset pagination (chunks of rows in the
// order of the order_by columns plus the primary key, each after the key
// of the last row of the one before, which an index serves); otherwise the
// order the rows were committed in, as far as the table tells it (commit
// timestamps, OrderCommitTime, or transaction ids, OrderCommit, then
// commands), from one sorted query, a Cursor fetched a chunk at a time.
// The key of the last row read (Chunk.Last) is text, so a job resumes
// from a checkpoint after a crash, and memory holds one chunk's bytes (two
// where the backfill reads a cursor's next while it sends one: package
// backfill; a read may hold more rows than a chunk, SetReadRows, within
// the same budget of value bytes, which does not count the 24 bytes of a
// value's slice).
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
//   - Without order_by, OrderAuto is an order of the commits
//     (OrderCommitTime where track_commit_timestamp is on, else
//     OrderCommit), never the primary key's (a random uuid is no order):
//     a plan reads in the primary key's order only when asked for
//     OrderColumns, as a job saved in it resumes. An order of the commits
//     takes no order_by: a plan asked for one with order_by fails.
//
//   - A Cursor reads in one snapshot, so no row moves in the order while it
//     reads: that of the transaction it is opened in, or, outside one, its
//     own, whose rows a WITH HOLD cursor keeps on the server, holding no
//     snapshot or lock. A Cursor opened after a saved key with a horizon
//     (checkpoint.Job.Horizon, the first read's snapshot's xmin) reads the
//     rows after the key and every row written at or past the horizon,
//     wherever they sort: an UPDATE moves a row in the order, even below
//     the saved key, but its transaction is at or past the horizon, so the
//     row is read again, never skipped (TestResumedCursorSkipsNoMovedRow).
//     It reads again the whole commit the key is in, from its first row
//     (the rows of one commit are in the order of their command ids and
//     ctids, which are not kept: TestCommitsReadInCommandOrder),
//     unless the job sent that commit whole (Plan.Whole, saved as
//     checkpoint.Job.Whole): then it reads from the next commit's, and an
//     event a redrive dropped is not read again (TestResumePastAWholeCommit).
//
//   - NewPlan checks the condition and the columns with the server before
//     anything is read: a condition that does not parse, or a column that
//     does not exist, is a one-line Error.
//
//   - Reads are read-only: Count, Last, Read and Open run in the
//     transaction the connection is in, which its caller began read-only
//     (a snapshot's), or in a read-only one of their own, as Plan.Role
//     (backfill.reader_role): a condition cannot write.
//
//   - A read in a transaction of its own runs in READ COMMITTED, whatever
//     default_transaction_isolation says, so that one that waited behind a
//     rewrite reads the rewritten table (TestChunkAfterARewrite).
//
//   - HoldFiles, in the caller's repeatable-read transaction, locks the
//     table and its leaves and fails, to be tried again, when the table
//     was rewritten, created again or had a partition attached or
//     detached since the snapshot: none of these is MVCC-safe, and such a
//     snapshot would read fewer rows without a word.
//
//   - A read names the table ONLY unless it is partitioned: the stream
//     takes a partition's insert for its table's and an inheritance
//     child's for none, so a table that inherits from the outbox, before
//     the snapshot or by an ALTER TABLE ... INHERIT after it, is not read
//     (TestReadsNoInheritingTable); HoldFiles locks it ONLY too, then a
//     partitioned table's leaves, so that a locked child, or a foreign one
//     that cannot be scanned, holds no read
//     (TestHoldFilesTouchesNoInheritingTable).
package tableread
