// Package route shapes an outbox event into the Kafka record consumers see:
// its topic, key, value and headers.
//
// Invariants:
//   - A topic is never rewritten into a different one. A value that cannot
//     form a legal Kafka topic name is an *outbox.EventError, and so is a
//     NULL event id or aggregate id: the connector stops on a poison event
//     rather than drop it or send it somewhere unexpected.
//   - The key is the aggregate id, so that one aggregate's events share a
//     partition and keep their commit order.
//   - The value is the payload bytes as stored: a jsonb payload is the JSON
//     document itself, never a JSON string.
package route
