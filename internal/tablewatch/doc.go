// Package tablewatch follows the outbox tables' lives for a session
// (docs/design.md, "Table changes"): the relation id streamed for each
// table, a table dropped and created again, one gone from the
// publication, one missing; and the leaf partitions of a partitioned
// table, found through their root.
//
// A table's inserts reach the slot only while the publication holds it: a
// table dropped and created again has a new relation id that a FOR TABLE
// publication does not hold, and its rows never reach the WAL stream. The
// checkpoint records the relation id streamed for each table
// (checkpoint.Record.Tables). Each session compares it with the catalog,
// at its start (Baseline) and every postgres.catalog_check_interval
// (Watch.Run).
//
// Invariants:
//
//   - a table with another relation id (recreated) is published again
//     (AddToPublication, when the role owns the publication and the table;
//     otherwise the session stops with the statement to run), and then
//     repaired: a snapshot of its rows is taken after it is published, a
//     ControlRepair message written after the snapshot, and where the
//     stream reaches the message the session sends the snapshot's rows
//     less those it streamed itself (the fresh events noted since the
//     session started, Fresh), and records the new relation id in the
//     checkpoint of that position (Done). Rows committed before the
//     snapshot are in it; rows committed after the table was published
//     are in the stream before the message; the noted ids keep a row in
//     both from going twice.
//   - the same table, gone from the publication, stops the session: its
//     rows inserted meanwhile cannot be told from the rows streamed
//     before, so only an operator can say which to send (cdc backfill).
//   - a table that does not exist is reported, and checked again: nothing
//     can be written to it meanwhile.
package tablewatch
