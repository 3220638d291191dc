// Package decode turns pgoutput (protocol version 1) messages into outbox
// events.
//
// Parsing is pure: bytes in, values out, no connection, so every message
// shape is tested on hand-built bytes and fuzzed. The Decoder keeps the
// relation cache pgoutput requires: a Relation message precedes the first
// change of a table in each replication session and after any change of its
// schema, and INSERTs refer to it by OID only.
//
// Invariants:
//   - Only INSERTs into configured tables, and transactional logical
//     decoding messages with a configured prefix, become events. UPDATE,
//     DELETE and TRUNCATE are never events; the publication only publishes
//     inserts, and a row deleted later in the same transaction is still
//     delivered because its INSERT is in the WAL. Other messages are
//     reported as ignored, never silently; an INSERT into a relation no
//     table maps is KindUnmapped, for the pipeline to count and report.
//   - A relation is a table's by its id before its name: Decoder.Known
//     names the relations the connector streamed for a table (renamed
//     since, or a swap's old table) and the leaf partitions found of it
//     (detached since), so none of them is ever KindUnmapped.
//   - A leaf partition's INSERT (a publication without
//     publish_via_partition_root) is its configured root's event, found
//     through Decoder.Partition; a relation of a configured table other
//     than the one the connector streamed (Decoder.Fresh) marks its events
//     Fresh: the table was recreated.
//   - A value that cannot be read as configured (a bad bytea, a message that
//     is not a JSON object) is a KindInvalid message for the source's
//     on_invalid policy, not a stream error and never a dropped event.
//   - A configured table whose Relation message lacks a mapped column is an
//     error, never a silently empty field.
//   - Values are copied out of the input: the caller's buffer is reused.
//   - Column values arrive in text format. json/jsonb/text values are passed
//     on as their bytes; bytea is hex-decoded to the raw bytes.
package decode
