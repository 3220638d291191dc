// Package tablewatch follows the outbox tables' lives for a session
// (docs/design.md, "Table changes"): the relation streamed for each table,
// followed by its id whatever its name; a table dropped and created again,
// or swapped for another under its name; one gone from the publication,
// or removed and added back; one missing; and the leaf partitions of a
// partitioned table, found through their root.
//
// A table's inserts reach the slot only while the publication holds it: a
// table dropped and created again has a new relation id that a FOR TABLE
// publication does not hold, and its rows never reach the WAL stream. The
// checkpoint records, for each table, the relation id streamed, the
// publication's membership that publishes it, and what of its rows the
// stream covered (checkpoint.Table). Each session compares them with the
// catalog, at its start (Baseline) and every
// postgres.catalog_check_interval (Watch.Run).
//
// Invariants:
//
//   - a relation streamed for a table is that table's by its id, whatever
//     it is named (Watch.Known, the decoder's first answer): a renamed
//     table streams on (followed, and said loudly: cdc_table_renamed), a
//     swap's old table stays the table's while it exists, and a leaf
//     partition found once stays its table's when detached; none of them
//     is ever an unmapped insert.
//   - another relation under a table's name (recreated, or a swap) is
//     published (AddToPublication, when the role owns the publication and
//     the table; otherwise the session stops with the statement to run),
//     and then repaired: once every transaction that was running when it
//     joined the publication has ended (postgres.WaitForOlder), a snapshot
//     of its rows is taken, and a ControlRepair message written after the
//     snapshot. Rows committed before the snapshot are in it; rows
//     inserted after the table joined the publication are in the stream
//     (a transaction that inserted before it joined ended before the
//     snapshot, so its rows are in the snapshot).
//   - on a primary, a relation is published (when the connector adds
//     it), snapshotted and announced in one transaction that holds the
//     table's writers off (lockedRepair): every row before the message is
//     in the snapshot, every row after it in the stream after it, and an
//     added table's rows go where it joined the publication; a writer
//     that holds the table past lockWait, or a role that may not lock it,
//     gets the path above.
//   - a look the stream waits for, and a leaf's lookup, read the catalog
//     only once a snapshot shows the transaction the stream read
//     (postgres.WaitVisible): the walsender sends a commit before it shows.
//   - a relation is named its table's (Watch.name, and so Known) before
//     any snapshot of it: the decoder maps its inserts from then on, one
//     it cached as unmapped too, so an insert is in the snapshot or in
//     the stream after the snapshot's rows, never in neither. An insert
//     whose transaction ended before the naming (NamedAfter) is the
//     repair's, however late the stream reads it: never the repair's
//     place, which would put rows written later ahead of it.
//   - a repair's rows go before every event of its relation the stream
//     carries, in the order they were committed (tableread.Order): at the
//     first such event (a fresh one) the stream waits for the snapshot
//     (Before), which it holds in the WAL, not in memory, and the session
//     sends the snapshot's rows there, records the relation in that
//     transaction's checkpoint note with what the snapshot showed (Done,
//     checkpoint.Table.Seen), and passes over the relation's events of the
//     transactions the snapshot shows, which it sent; the others began or
//     committed after the snapshot, so after every row it sent (the event
//     it waited at is among those passed over when the snapshot came after
//     it). Where no fresh event comes first, the rows go at
//     the message, less the fresh events of skipped transactions (Fresh:
//     Kafka holds them). A row goes once, in its place.
//   - the same relation gone from the publication, or published through
//     another membership (removed and added back), stops the session: its
//     rows inserted meanwhile cannot be told from the rows streamed
//     before, so only an operator can say which to send (cdc backfill).
//     Found so at a start, the membership is taken as it is, said loudly,
//     and the table's Floor moves to now: retention keeps the rows from
//     before.
//   - a publication dropped, one that stopped publishing inserts, or one
//     with a row filter for a table stops the session; one that stopped
//     publishing partitioned tables via their root is set back where the
//     role owns it.
//   - a table with rows below its Floor (never streamed) rewritten since
//     the Floor was set (its files, checkpoint.Table.Files, changed) has
//     its Floor set anew, with its files then, where the stream reaches a
//     ControlRepair message without rows (checkFiles), or at the next
//     start (Baseline): a rewrite gives every row its xid, and retention,
//     which checks the files itself, deletes none of the table's rows
//     until then.
//   - a table that does not exist under its name, and whose relation does
//     not exist either, is reported, and checked again: nothing can be
//     written to it meanwhile.
package tablewatch
