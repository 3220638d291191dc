// Command consumer is an example consumer service for the connector's
// topics. It applies each event to its own database exactly once, with at-
// least-once delivery underneath (docs/consumers.md):
//
//   - one database transaction per record, in which inbox.Process records
//     the event id and runs the work only the first time the id is seen;
//   - the Kafka offsets are committed only after the transactions of the
//     records they cover have committed.
//
// A crash anywhere, even between a database commit and the offset commit,
// redelivers records whose ids are already in the inbox; they are skipped.
// Its work is a projection: a count of events per aggregate, which a
// second application of one event would get wrong.
//
//	KAFKA_BROKERS=localhost:9094 DATABASE_URL=postgres://... go run ./examples/consumer
//
// CONSUMER_GROUP (aggregate-events), TOPICS (a regular expression,
// ^outbox\.event\..*) and SESSION_TIMEOUT (45s) are optional.
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"os/signal"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/inbox"
)

const schema = `
CREATE TABLE IF NOT EXISTS aggregate_events (
  aggregate_type text NOT NULL,
  aggregate_id text NOT NULL,
  events bigint NOT NULL,
  last_event_id text NOT NULL,
  PRIMARY KEY (aggregate_type, aggregate_id)
);
CREATE TABLE IF NOT EXISTS applied (event_id text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil && !errors.Is(err, context.Canceled) {
		log.Fatalf("consumer: %v", err)
	}
}

func getenv(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func run(ctx context.Context) error {
	group := getenv("CONSUMER_GROUP", "aggregate-events")
	topics := getenv("TOPICS", `^outbox\.event\..*`)
	if _, err := regexp.Compile(topics); err != nil {
		return fmt.Errorf("TOPICS %q: %v", topics, err)
	}
	db, err := pgx.Connect(ctx, getenv("DATABASE_URL", "postgres://localhost:5432/app"))
	if err != nil {
		return fmt.Errorf("connect to DATABASE_URL: %w", err)
	}
	defer db.Close(context.Background())
	if err := (inbox.Inbox{}).Create(ctx, db); err != nil {
		return err
	}
	if _, err := db.Exec(ctx, schema); err != nil {
		return err
	}
	// How long the group waits for a member that stopped answering (a
	// crashed one) before giving its partitions to another.
	session, err := time.ParseDuration(getenv("SESSION_TIMEOUT", "45s"))
	if err != nil {
		return fmt.Errorf("SESSION_TIMEOUT: %v", err)
	}
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(strings.Split(getenv("KAFKA_BROKERS", "localhost:9094"), ",")...),
		kgo.ConsumerGroup(group), kgo.ConsumeRegex(), kgo.ConsumeTopics(topics),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.SessionTimeout(session),
		// Offsets are committed by hand, after the database.
		kgo.DisableAutoCommit(),
	)
	if err != nil {
		return err
	}
	defer cl.Close()
	log.Printf("consumer %s: reading %s", group, topics)
	for {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err := fs.Err0(); err != nil {
			return fmt.Errorf("fetch: %w", err)
		}
		for _, r := range fs.Records() {
			if err := apply(ctx, db, group, r); err != nil {
				// Stop without committing: a restart redelivers from the
				// last committed offset, and the inbox skips what this
				// process had already applied.
				return err
			}
		}
		if err := cl.CommitUncommittedOffsets(ctx); err != nil {
			return fmt.Errorf("commit offsets: %w", err)
		}
	}
}

// apply applies one record in one transaction, through the inbox.
func apply(ctx context.Context, db *pgx.Conn, group string, r *kgo.Record) error {
	id, err := inbox.RecordEventID(r)
	if err != nil {
		return fmt.Errorf("%s/%d@%d: %w", r.Topic, r.Partition, r.Offset, err)
	}
	aggType := r.Topic // the connector's aggregate_type header, or else the topic
	for _, h := range r.Headers {
		if h.Key == "aggregate_type" {
			aggType = string(h.Value)
		}
	}
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		_, err := inbox.Process(ctx, tx, group, id, func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO applied (event_id) VALUES ($1)`, id); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO aggregate_events (aggregate_type, aggregate_id, events, last_event_id) VALUES ($1, $2, 1, $3)
				ON CONFLICT (aggregate_type, aggregate_id) DO UPDATE SET events = aggregate_events.events + 1, last_event_id = $3`,
				aggType, string(r.Key), id)
			return err
		})
		return err
	})
}
