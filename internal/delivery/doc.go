// Package delivery turns Kafka acknowledgements into the position the
// replication slot may be confirmed to, in either delivery mode.
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
// A session confirms in one of two ways, side by side here, both wal.Acks:
// at least once, a Confirmer lets the replication loop confirm only what an
// acknowledged checkpoint record covers, so the slot is never ahead of its
// checkpoint (docs/design.md, "Invariants"); exactly once, a Committer
// commits Kafka transactions that hold whole Postgres transactions and,
// last, the record of their end, under a transactional id per slot and
// database system whose new holder fences the last one. Progress is what
// the next record adds to the last one saved: replay marks, the replay
// window, retention marks. The record itself and its store are package
// checkpoint's.
package delivery
