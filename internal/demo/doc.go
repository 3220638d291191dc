// Package demo is cdc demo: everything in one process, a throwaway
// Postgres (or the user's, from CDC_DEMO_POSTGRES_URL), an embedded
// Kafka-protocol broker (franz-go's kfake, or CDC_DEMO_KAFKA_BROKERS), the
// connector, and a small order service that writes business rows and
// outbox events in the same transactions. It shows each event as Kafka
// acknowledges it, then replays them by time.
//
// Invariants:
//   - The connector is the pipeline cdc run starts (pipeline.New and Run),
//     so what the demo shows is what a deployment does.
//   - In the user's database the demo touches only its own names (schema,
//     publication and slots cdc_demo...), and removes them before and
//     after it runs; a server it started is stopped when it ends.
package demo
