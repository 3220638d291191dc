// Package schema is the data contract at the relay: it checks each event's
// JSON payload against its subject's schema in a Confluent-compatible
// Schema Registry and encodes it in the table's wire format (JSON Schema,
// Avro or protobuf), framed as the registry's deserialisers expect
// (docs/config.md, "Schema Registry").
//
// Invariants:
//   - Nothing is sent unchecked. A payload that does not match its schema
//     is an *outbox.EventError (dead-lettered or stopping the connector,
//     per on_invalid). A registry that cannot answer (down, no such
//     subject, a schema that does not compile) makes the event wait: the
//     lookup is retried with a backoff, on the session's blocking path,
//     and the event's transaction stays open, so nothing past it is sent
//     or confirmed. A registry outage never dead-letters an event.
//   - Encode never waits on the network. A schema it has not cached is a
//     *Miss, which Resolve fetches on the replication loop's blocking path (the
//     slot's lease kept, docs/design.md, "One goroutine owns the connection").
//   - A schema is looked up by subject and version, cached, and re-read
//     when an event does not fit the latest one cached, so a schema
//     evolved while streaming is picked up, and an event is only judged
//     invalid against the registry's latest (or the pinned version).
//   - Secrets (password, token) are read from their files at each request
//     and never appear in an error.
//   - Subjects can come from the rows (templated topics, event types): a
//     source's cache holds at most maxCachedSubjects entries, then starts
//     over, and schema.file is registered only under topic subjects.
package schema
