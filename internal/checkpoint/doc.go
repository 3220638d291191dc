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
// Replay and exactly-once delivery will add a durable checkpoint store next
// to the Tracker: the durable position then lives in the store, and the slot
// is confirmed only up to a retention window behind it.
package checkpoint
