// Package checkpoint turns Kafka acknowledgements into the position the
// replication slot may be confirmed to.
//
// The Tracker is the only place that decides what "done" means:
//
//   - The watermark is the highest transaction end LSN L such that every
//     event of every transaction ending at or before L has been acknowledged
//     by Kafka. Acks arrive out of order across partitions, so the Tracker
//     keeps transactions in commit order and only pops a finished prefix;
//     it never uses "the last ack received".
//   - A failed produce is never acknowledged: its transaction stays pending
//     forever, so the watermark can never pass it, and Err reports the
//     failure so the replication loop ends the session and Postgres
//     re-sends from the last confirmed position.
//   - A transaction with no outbox events resolves as soon as everything
//     before it has.
//   - Row LSNs are not unique and are not used: only the end LSN of a
//     commit, which is where Postgres resumes without resending it.
//
// The replication loop reads the watermark as a value (Confirmed) and waits
// on Changed; acks are written from the Kafka client's goroutines. Nothing
// here touches the replication connection.
//
// The durable side: a Store keeps one Record per pipeline in a compacted
// Kafka topic. A session confirms in one of two ways, side by side here,
// both wal.Acks: at least once, a Confirmer lets the replication loop
// confirm only what an acknowledged Record covers, so the slot is never
// ahead of its checkpoint (docs/design.md, rules 15 and 16); exactly once,
// a Committer commits Kafka transactions that hold whole Postgres
// transactions and, last, the Record of their end, under a transactional
// id per slot and database system whose new holder fences the last one
// (rule 19). Decide compares the two on start: a missing slot, a slot past
// the checkpoint, or another database system is a *GapError, never a first
// start. Records also carry the replay window and its marks (position, time
// samples), and the history of accepted gaps and rewinds.
package checkpoint
