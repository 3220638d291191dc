// Package route shapes an outbox event into the Kafka record consumers see:
// its topic, key, value and headers.
//
// Invariants:
//   - A topic is never rewritten into a different one unless the source
//     turned a normalisation on. A value that cannot form a legal Kafka
//     topic name is an *outbox.EventError, and so is a NULL event id or a
//     NULL in the key template: the pipeline stops on such an event or
//     dead-letters it, never drops it or sends it somewhere unexpected.
//   - The key defaults to the aggregate id, so that one aggregate's events
//     share a partition and keep their commit order.
//   - A json/jsonb payload is the JSON document itself in every format,
//     never a JSON string.
//   - A table's filter and expressions (package expr) are evaluated on
//     copies of what they read of the event, never keeping the event: an
//     event its filter leaves out is ErrFiltered, which is not a record and
//     not an *outbox.EventError, so a caller that does not know it stops
//     rather than drop it; an expression that fails makes the event an
//     *outbox.EventError, as a template that cannot expand does, and a
//     topic it computes is checked and bound (max_topics) as a template's.
package route
