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
package route
