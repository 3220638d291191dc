// Package outbox holds the domain types every pipeline stage shares: the
// configured outbox tables, their column mapping, and the Event the decoder
// produces from one INSERT.
//
// Invariants:
//   - An Event owns its byte slices. The decoder copies them out of the
//     replication buffer, which pgconn reuses on the next receive, because
//     the Kafka client holds a record until the broker acknowledges it.
//   - A nil slice is SQL NULL; a non-nil empty slice is the empty string.
//   - Identifiers are stored as Postgres stores them (unquoted names are
//     folded to lower case on parse), so they compare equal to the names
//     pgoutput sends in Relation messages.
package outbox
