// Package backfill owns backfills: it has the rows already in an outbox
// table sent as events: a poller's pending rows on the first start, the
// rows an operator asks for with cdc backfill, and a recreated table's
// rows for its repair (Snapshot). It holds the jobs and their watermark
// state machine (Jobs: pure, events in, rows to send and checkpoint notes
// out), the runner that reads the chunks (Runner), the first start's job,
// and whether a request runs (Jobs.Admit: its signature, kept with it as a
// checkpoint.Request, its age, its table). How a table's rows are read
// (the plan and its order, keyset chunks, the cursor, the snapshot's
// check) is package tableread's. The pipeline feeds it the stream's
// control messages and sends what it hands back.
//
// Invariants:
//
//   - A job keeps its order (checkpoint.Job.Order) and resumes in it; one
//     with neither a saved position nor a saved order, and a repair, ask
//     for tableread.OrderAuto, so that without order_by they read in the
//     order of the commits. Each job's run and each repair logs which order it reads
//     in, warning where that order may not be the commits'
//     (tableread.OrderCommit: overlapping transactions, savepoints; a job
//     saved in primary-key order, which resumes in it).
//
//   - A job in the order of the commits keeps its cursor's Horizon
//     (checkpoint.Job.Horizon) with its progress, and a
//     resumed one opens its cursor after its saved key with that horizon:
//     the rows an UPDATE moved below the key are read again, not skipped.
//
//   - The first start's job reads in the snapshot the slot exported, and
//     is sent before the stream's first transaction, in transactions that end
//     at the slot's consistent point (docs/design.md, "Backfill consistency").
//     What the configuration's jobs left (a first start interrupted, a slot
//     adopted without a checkpoint) runs to its end before the next
//     session's stream too (Runner.Continue), in a snapshot of now: an
//     aggregate's older rows come before its events after the slot, at the
//     cost of sending those events twice (TestUnfinishedBackfillKeepsOrder).
//     Such a job never runs beside the stream: one whose table is gone, or
//     that the configuration no longer asks for, is ended before it; any
//     other failure holds the stream (retried, or a stop saying what to
//     fix). It resumes in its saved order (checkpoint.Job.Key), with the
//     configuration's condition (Trusted), on the relation it began on.
//     Those reads take every table at once, merged in the order of the
//     commits, so that an aggregate's events in two outbox tables keep
//     their order (TestBackfillAcrossTwoTables); where the tables cannot
//     tell it (order_by beside another table, one transaction writing an
//     aggregate into two), they stop, unless backfill.on_unknown_order:
//     send (tableread.Crossing). A stop on an event checkpoints what was
//     sent before it and the keys parked, and resumes at that event, past
//     the last transaction sent whole (checkpoint.Job.Whole). A table read
//     alone from a cursor reads four chunks' rows a FETCH (readChunks;
//     within one chunk's byte budget), hands them out a chunk at a time,
//     and reads the next FETCH while they are sent: in order, each once,
//     the bytes in flight leaving room for both reads, and a job saved
//     whole only when its last commit was (TestReadAheadKeepsTheOrder,
//     and across stops and starts TestInterruptedFirstStartsLoseNoRow).
//     A table read alone from its first row in a snapshot's transaction
//     (a first start's, an adopted slot's) is read by one COPY instead
//     (readAheadAlone, package copyread), by one sort where the cursor's
//     query sorts twice: the cursor's rows in its order up to the first
//     commit it orders by place (a cmin overwritten, Plan.CopySQL), from
//     which the cursor, moved past them, reads on in the same snapshot
//     (TestCopyHandsFlaggedCommitsToTheCursor). It holds two chunks, and
//     backfill.statement_timeout bounds its first row's wait, not the
//     copy (TestCopyOutlivesTheStatementTimeout).
//
//   - A read in an older snapshot (the first start's, a repair's) first
//     has tableread.HoldFiles check the table, before its plan reads the
//     key and columns: one rewritten, created again or with a partition
//     attached or detached since the snapshot fails, to be tried again,
//     instead of sending fewer rows without a word
//     (TestRewriteAfterTheSnapshot, TestPartitionsChangedAfterTheSnapshot,
//     TestSnapshotWaitsForARewrite). A chunk beside the stream is read in a
//     read-only transaction of its own, begun after its low watermark
//     committed.
//
//   - An operator's job reads each chunk between a low and a high watermark,
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
