// Package schema is the data contract at the relay: it checks each event's
// JSON payload against its subject's schema in a Confluent-compatible
// Schema Registry and encodes it in the table's wire format (JSON Schema,
// Avro or protobuf), framed as the registry's deserialisers expect
// (docs/config.md, "Schema Registry").
//
// Invariants:
//   - Nothing is sent unchecked. A payload that does not match its schema
//     is an *outbox.EventError (dead-lettered or stopping the connector,
//     per on_invalid); a registry that cannot answer is a plain error: the
//     session ends before anything past the event is confirmed, and the
//     next one retries after a backoff. A registry outage never
//     dead-letters an event.
//   - Encode never waits on the network. A schema it has not cached is a
//     *Miss, which Resolve fetches on the replication loop's blocking
//     path (the slot's lease kept, docs/design.md rule 9).
//   - A schema is looked up by subject and version, cached, and re-read
//     when an event does not fit the latest one cached (at most once a
//     second per subject), so a schema evolved while streaming is picked
//     up and an event is judged against the registry's latest.
//   - Secrets (password, token) are read from their files at each request
//     and never appear in an error.
package schema
