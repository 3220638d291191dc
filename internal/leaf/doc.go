// Package leaf finds the configured outbox table a leaf partition belongs
// to, for the decoder (decode.Decoder.Partition), when pgoutput names an
// insert by the leaf: a publication without publish_via_partition_root, a
// broader one (FOR ALL TABLES, a schema), or a leaf detached since.
//
// Invariants:
//   - a leaf is the table's when an ancestor is: by the ancestor's id, as
//     the tables' watch knows it (a renamed table's partitions), or else by
//     its configured name; a leaf none of them holds is no table's.
//   - a lookup reads the catalog only once a snapshot shows the
//     transaction the stream read the leaf's Relation message in
//     (postgres.WaitVisible): a partition created or attached in it is in
//     no catalog before, and its rows would be taken for no table's.
package leaf
