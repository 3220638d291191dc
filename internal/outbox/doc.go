// Package outbox holds the domain types every pipeline stage shares: the
// configured sources of events (outbox tables, or logical decoding message
// prefixes) with their field mapping and routing options as plain data, and
// the Event the decoder produces from one INSERT or message.
//
// Invariants:
//   - An Event owns its byte slices. The decoder copies them out of the
//     replication buffer, which pgconn reuses on the next receive, because
//     the Kafka client holds a record until the broker acknowledges it.
//   - A nil Value.B is SQL NULL (or a missing JSON member); a non-nil empty
//     slice is the empty string.
//   - Every Value carries the Kind its column type (or JSON type) gives it,
//     so formats that embed values (envelope, CloudEvents) keep their types.
//   - Identifiers are stored as Postgres stores them (unquoted names are
//     folded to lower case on parse), so they compare equal to the names
//     pgoutput sends in Relation messages.
//   - What a source's templates, filter and expressions read of a row is
//     known once Validate has run: the columns join Extra, and the filter
//     and expressions are compiled (Programs, package expr), so a bad
//     expression stops the start, never an event.
package outbox
