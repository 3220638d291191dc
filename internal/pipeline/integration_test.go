package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxcdc/cdc/internal/config"
	"github.com/outboxcdc/cdc/internal/delivery"
	"github.com/outboxcdc/cdc/internal/fault"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/pipeline"
	"github.com/outboxcdc/cdc/internal/postgres"
	"github.com/outboxcdc/cdc/internal/route"
	"github.com/outboxcdc/cdc/internal/setup"
	"github.com/outboxcdc/cdc/internal/sink"
	"github.com/outboxcdc/cdc/internal/testenv"
	"github.com/outboxcdc/cdc/internal/wal"
)

var pg *testenv.Postgres

func TestMain(m *testing.M) { testenv.Main(m, &pg) }

// Debezium's default outbox layout, plus a business table the writers
// update in the same transaction.
const schema = `
CREATE TABLE outbox (
  id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
  aggregatetype text NOT NULL,
  aggregateid text NOT NULL,
  type text NOT NULL,
  payload jsonb
);
CREATE TABLE aggregates (id text PRIMARY KEY, seq int NOT NULL DEFAULT 0);
CREATE TABLE other (id bigserial PRIMARY KEY, note text);
`

type env struct {
	db    string
	kafka *testenv.Kafka
	cfg   config.Config
	// logLevel is the pipeline's log level; CDC_TEST_LOG overrides it.
	logLevel hclog.Level
	// onChunk is the pipeline's Options.OnBackfillChunk.
	onChunk func(low, high pglogrepl.LSN, read, sent int)
	// onDelivered is the pipeline's Options.OnDelivered.
	onDelivered func(rec *kgo.Record, err error)
	// logOut is where start writes the log; os.Stderr when nil.
	logOut io.Writer
	// clock and retentionInterval are the pipeline's Options.Clock and
	// Options.RetentionInterval.
	clock             func() time.Time
	retentionInterval time.Duration
}

func newEnv(t *testing.T, kafka *testenv.Kafka) *env {
	t.Helper()
	p := testenv.Require(t, pg)
	db := p.NewDatabase(t)
	testenv.Exec(t, db, schema)
	return &env{db: db, kafka: kafka, cfg: newEnvConfig(db, kafka)}
}

func newEnvConfig(db string, kafka *testenv.Kafka) config.Config {
	return config.Config{
		Postgres: postgres.Config{URL: db, StatusInterval: 50 * time.Millisecond},
		Kafka:    sink.Config{Brokers: kafka.Brokers},
		Tables: []*outbox.Source{{
			Name:    outbox.TableName{Schema: "public", Name: "outbox"},
			Columns: outbox.DefaultColumns,
			Topic:   kafka.Prefix + outbox.DefaultTopic,
		}},
		RetryBackoff:    100 * time.Millisecond,
		RetryBackoffMax: time.Second,
		Checkpoint:      config.CheckpointConfig{Topic: kafka.CheckpointTopic(), SigningKeys: [][]byte{[]byte(testSigningKey)}},
	}
}

// testSigningKey signs the tests' backfill requests.
const testSigningKey = "0123456789abcdef0123456789abcdef-test"

// sweptLog is a log writer for security tests: at the end of the test it
// fails on any line holding one of the secrets, and on a log of fewer than
// minLines lines (one that did not see the run). It writes nothing else.
func sweptLog(t *testing.T, minLines int, secrets ...string) io.Writer {
	t.Helper()
	w := &testenv.Buffer{}
	t.Cleanup(func() {
		lines := strings.Split(strings.TrimSuffix(w.String(), "\n"), "\n")
		if len(lines) < minLines {
			t.Errorf("the swept log has %d lines: it did not see the run", len(lines))
		}
		for i, line := range lines {
			for _, s := range secrets {
				if strings.Contains(line, s) {
					t.Errorf("log line %d shows a secret: %s", i+1, line)
				}
			}
		}
	})
	return w
}

// running is a pipeline started in the background.
type running struct {
	p       *pipeline.Pipeline
	cancel  context.CancelFunc
	done    chan error
	tracker atomic.Pointer[delivery.Tracker]
}

func (e *env) start(t *testing.T) *running {
	t.Helper()
	out := e.logOut
	if out == nil {
		out = os.Stderr
	}
	r := e.launch(t, out)
	// Events committed before the slot exists are not streamed: wait until
	// the first session is streaming.
	testenv.Eventually(t, 30*time.Second, "the pipeline to start streaming", func() bool {
		select {
		case err := <-r.done:
			close(r.done)
			t.Fatalf("the pipeline stopped before it streamed: %v", err)
		default:
		}
		return r.tracker.Load() != nil
	})
	return r
}

// launch starts the pipeline without waiting for it to stream.
func (e *env) launch(t *testing.T, logOut io.Writer) *running {
	t.Helper()
	level := hclog.LevelFromString(os.Getenv("CDC_TEST_LOG"))
	if level == hclog.NoLevel {
		level = e.logLevel
	}
	if level == hclog.NoLevel {
		level = hclog.Warn
	}
	r := &running{done: make(chan error, 1)}
	p, err := pipeline.New(e.cfg, hclog.New(&hclog.LoggerOptions{Name: t.Name(), Level: level, Output: logOut}), pipeline.Options{
		KafkaOpts:       []kgo.Opt{kgo.MetadataMinAge(100 * time.Millisecond), kgo.RetryBackoffFn(func(int) time.Duration { return 50 * time.Millisecond })},
		OnSession:       func(tr *delivery.Tracker) { r.tracker.Store(tr) },
		OnBackfillChunk: e.onChunk,
		OnDelivered:     e.onDelivered,
		Clock:           e.clock, RetentionInterval: e.retentionInterval,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel, r.p = cancel, p
	go func() { r.done <- p.Run(ctx) }()
	t.Cleanup(func() { r.stop(t) })
	return r
}

// stop shuts the pipeline down and returns what Run returned.
func (r *running) stop(t *testing.T) error {
	t.Helper()
	r.cancel()
	select {
	case err, ok := <-r.done:
		if ok {
			close(r.done)
		}
		return err
	case <-time.After(60 * time.Second):
		t.Fatal("pipeline did not stop within 60s")
		return nil
	}
}

// waitFatal waits for Run to return on its own.
func waitFatal(t *testing.T, r *running) error {
	t.Helper()
	select {
	case err := <-r.done:
		close(r.done)
		return err
	case <-time.After(2 * time.Minute):
		t.Fatal("the connector kept running")
		return nil
	}
}

func aggType(i int) string {
	if i%2 == 0 {
		return "order"
	}
	return "customer"
}

// payload is written in jsonb's canonical text form (keys by length, then
// bytes; ", " and ": " separators), so the bytes read back are the same.
func payload(agg string, seq, writer int) string {
	return fmt.Sprintf(`{"agg": "%s", "seq": %d, "note": "ünïcødé ✓", "nested": {"n": [1, 2], "w": %d}}`, agg, seq, writer)
}

// TestConcurrentWriters: 8 writers commit 10,000 events over 200
// aggregates in single-row and multi-row transactions. Every event arrives
// once, in its topic, with its key, headers and payload bytes; within each
// aggregate Kafka order equals commit order.
func TestConcurrentWriters(t *testing.T) {
	const (
		writers    = 8
		total      = 10_000
		aggregates = 200
	)
	e := newEnv(t, testenv.NewKafka(t))
	testenv.Exec(t, e.db, fmt.Sprintf(`INSERT INTO aggregates SELECT 'agg-' || lpad(i::text, 3, '0') FROM generate_series(0, %d) i`, aggregates-1))
	e.start(t)

	var reserved atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			conn := testenv.Connect(t, e.db)
			rng := rand.New(rand.NewSource(int64(w)))
			ctx := context.Background()
			for {
				n := 1
				if rng.Intn(2) == 0 {
					n = 2 + rng.Intn(4) // multi-row transaction
				}
				if end := reserved.Add(int64(n)); end > total {
					n -= int(end - total)
					if n <= 0 {
						return
					}
				}
				aggs := make([]int, n)
				for i := range aggs {
					aggs[i] = rng.Intn(aggregates)
				}
				// Lock aggregates in one order so writers cannot deadlock.
				sort.Ints(aggs)
				err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
					var sql strings.Builder
					sql.WriteString("INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ")
					var args []any
					for i, a := range aggs {
						agg := fmt.Sprintf("agg-%03d", a)
						var seq int
						// The row lock orders this aggregate's transactions:
						// commit order equals seq order.
						if err := tx.QueryRow(ctx, `UPDATE aggregates SET seq = seq + 1 WHERE id = $1 RETURNING seq`, agg).Scan(&seq); err != nil {
							return err
						}
						if i > 0 {
							sql.WriteString(", ")
						}
						fmt.Fprintf(&sql, "($%d, $%d, $%d, $%d)", len(args)+1, len(args)+2, len(args)+3, len(args)+4)
						args = append(args, aggType(a), agg, fmt.Sprintf("Event%d", seq%3), payload(agg, seq, w))
					}
					_, err := tx.Exec(ctx, sql.String(), args...)
					return err
				})
				if err != nil {
					errs <- fmt.Errorf("writer %d: %w", w, err)
					return
				}
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	endOfWrites := testenv.CurrentWAL(t, e.db)

	c := e.kafka.NewConsumer(t, "^"+strings.ReplaceAll(e.kafka.Prefix, ".", `\.`)+`outbox\.event\..*`)
	c.WaitCount(t, 3*time.Minute, total)
	// A duplicate, beyond the total, is in Kafka once the slot confirmed
	// the writes.
	c.SettleConfirmed(t, time.Minute, e.db, "outbox_cdc")

	// Ground truth from the table itself.
	type row struct{ aggType, aggID, typ, payload string }
	want := map[string]row{}
	rows, err := testenv.Connect(t, e.db).Query(context.Background(), `SELECT id::text, aggregatetype, aggregateid, type, payload::text FROM outbox`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		var r row
		if err := rows.Scan(&id, &r.aggType, &r.aggID, &r.typ, &r.payload); err != nil {
			t.Fatal(err)
		}
		want[id] = r
	}
	if rows.Err() != nil || len(want) != total {
		t.Fatalf("outbox holds %d rows (%v), want %d", len(want), rows.Err(), total)
	}

	seen := map[string]bool{}
	lastSeq := map[string]int{}
	for _, rec := range c.Records {
		id := testenv.Header(rec, route.HeaderID)
		w, ok := want[id]
		if !ok {
			t.Fatalf("record with unknown id %q: %s", id, rec.Value)
		}
		if seen[id] {
			t.Fatalf("event %s delivered twice in a run without faults", id)
		}
		seen[id] = true
		if wantTopic := e.kafka.Prefix + "outbox.event." + w.aggType; rec.Topic != wantTopic {
			t.Errorf("event %s in topic %s, want %s", id, rec.Topic, wantTopic)
		}
		if string(rec.Key) != w.aggID {
			t.Errorf("event %s key %q, want %q", id, rec.Key, w.aggID)
		}
		if string(rec.Value) != w.payload {
			t.Errorf("event %s value %q, want the stored bytes %q", id, rec.Value, w.payload)
		}
		if got := testenv.Header(rec, route.HeaderEventType); got != w.typ {
			t.Errorf("event %s event_type %q, want %q", id, got, w.typ)
		}
		if got := testenv.Header(rec, route.HeaderAggregateType); got != w.aggType {
			t.Errorf("event %s aggregate_type %q, want %q", id, got, w.aggType)
		}
		if lsn, err := pglogrepl.ParseLSN(testenv.Header(rec, route.HeaderCommitLSN)); err != nil || lsn == 0 || lsn > endOfWrites {
			t.Errorf("event %s commit_lsn %q (%v) not within the writes", id, testenv.Header(rec, route.HeaderCommitLSN), err)
		}
		// Records of one key share a partition, and a partition is read
		// in order, so each aggregate's seq must count up by one.
		var seq int
		fmt.Sscanf(w.payload[strings.Index(w.payload, `"seq": `)+7:], "%d", &seq)
		if seq != lastSeq[w.aggID]+1 {
			t.Fatalf("aggregate %s: seq %d after %d; per-aggregate order broken", w.aggID, seq, lastSeq[w.aggID])
		}
		lastSeq[w.aggID] = seq
	}
	if len(seen) != total {
		t.Fatalf("%d distinct events delivered, want %d", len(seen), total)
	}
	testenv.Eventually(t, 30*time.Second, "the slot to confirm past the last write", func() bool {
		return testenv.SlotPosition(t, e.db, "outbox_cdc") >= endOfWrites
	})
}

func insertEvent(t *testing.T, conn *pgx.Conn, aggID, typ string) string {
	t.Helper()
	var id string
	err := conn.QueryRow(context.Background(),
		`INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('order', $1, $2, '{"k": 1}') RETURNING id::text`, aggID, typ).Scan(&id)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// insertEventTx inserts one event in its own transaction and returns its id
// and the transaction's xid.
func insertEventTx(t *testing.T, conn *pgx.Conn, aggType, aggID, typ, payloadSQL string) (id, xid string) {
	t.Helper()
	ctx := context.Background()
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ($1, $2, $3, `+payloadSQL+`) RETURNING id::text`, aggType, aggID, typ).Scan(&id); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `SELECT pg_current_xact_id()::text`).Scan(&xid)
	})
	if err != nil {
		t.Fatal(err)
	}
	return id, xid
}

func ids(recs []*kgo.Record) map[string]int {
	m := map[string]int{}
	for _, r := range recs {
		m[testenv.Header(r, route.HeaderID)]++
	}
	return m
}

// TestRollbackNeverAppears: a rolled-back transaction's event is never
// delivered, while the committed ones around it are.
func TestRollbackNeverAppears(t *testing.T) {
	e := newEnv(t, testenv.NewKafka(t))
	e.start(t)
	conn := testenv.Connect(t, e.db)
	ctx := context.Background()

	before := insertEvent(t, conn, "a-1", "Before")
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var rolledBack string
	if err := tx.QueryRow(ctx, `INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('order', 'a-1', 'RolledBack', '{}') RETURNING id::text`).Scan(&rolledBack); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	after := insertEvent(t, conn, "a-1", "After")

	c := e.kafka.NewConsumer(t, e.kafka.AllTopics())
	c.WaitFor(t, time.Minute, "the event committed after the rollback", func(r []*kgo.Record) bool { return ids(r)[after] > 0 })
	// Everything the connector owes is in Kafka and read: a rolled-back
	// event or a duplicate would be counted.
	c.SettleConfirmed(t, time.Minute, e.db, "outbox_cdc")
	got := ids(c.Records)
	if got[before] != 1 || got[after] != 1 || got[rolledBack] != 0 || len(c.Records) != 2 {
		t.Fatalf("delivered %v; want %s and %s once and never %s", got, before, after, rolledBack)
	}
}

// TestInsertThenDeleteInOneTransaction: Debezium's recommended pattern,
// deleting the outbox row in the same transaction, still delivers it.
func TestInsertThenDeleteInOneTransaction(t *testing.T) {
	e := newEnv(t, testenv.NewKafka(t))
	e.start(t)
	conn := testenv.Connect(t, e.db)
	ctx := context.Background()
	var id string
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('order', 'd-1', 'Deleted', '{"gone": false}') RETURNING id::text`).Scan(&id); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `DELETE FROM outbox WHERE id = $1`, id)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	var n int
	testenv.QueryRow(t, e.db, `SELECT count(*) FROM outbox`, nil, &n)
	if n != 0 {
		t.Fatalf("outbox has %d rows after the delete", n)
	}
	c := e.kafka.NewConsumer(t, e.kafka.AllTopics())
	c.WaitCount(t, time.Minute, 1)
	r := c.Records[0]
	if testenv.Header(r, route.HeaderID) != id || string(r.Key) != "d-1" || string(r.Value) != `{"gone": false}` {
		t.Fatalf("record = key %q value %q id %q; want the deleted row's event %s", r.Key, r.Value, testenv.Header(r, route.HeaderID), id)
	}
}

// TestQuietOutboxBusyDatabase: only a non-outbox table is written; the slot
// must follow the WAL so that Postgres does not retain it.
func TestQuietOutboxBusyDatabase(t *testing.T) {
	e := newEnv(t, testenv.NewKafka(t))
	e.start(t)
	conn := testenv.Connect(t, e.db)
	// Let the connector deliver one event first, so the test also covers
	// moving on from an acknowledged position.
	insertEvent(t, conn, "q-1", "First")
	c := e.kafka.NewConsumer(t, e.kafka.AllTopics())
	c.WaitCount(t, time.Minute, 1)
	start := testenv.SlotPosition(t, e.db, "outbox_cdc")

	for i := 0; i < 300; i++ {
		if _, err := conn.Exec(context.Background(), `INSERT INTO other (note) VALUES (repeat('x', 500))`); err != nil {
			t.Fatal(err)
		}
	}
	end := testenv.CurrentWAL(t, e.db)
	if end-start < 100_000 {
		t.Fatalf("the writes produced only %d bytes of WAL; the test proves nothing", end-start)
	}
	testenv.Eventually(t, 30*time.Second, fmt.Sprintf("confirmed_flush_lsn to reach %s", end), func() bool {
		return testenv.SlotPosition(t, e.db, "outbox_cdc") >= end
	})
	var retained int64
	testenv.QueryRow(t, e.db, `SELECT pg_current_wal_lsn() - confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = 'outbox_cdc'`, nil, &retained)
	t.Logf("slot moved from %s past %s; %d bytes behind the current WAL", start, end, retained)
	c.Settle(t) // the slot confirmed past every write: a stray record is in Kafka
	if len(c.Records) != 1 {
		t.Fatalf("%d records; only the first event was an outbox event", len(c.Records))
	}
}

// TestPartitionFaultHoldsConfirmedPosition injects a produce error on one
// partition while the others succeed: confirmed_flush_lsn must never pass
// the failed transaction, and everything is delivered once the fault clears.
//
// A retriable error keeps the failed record in flight while later ones are
// acked (batching holds them at most kafka.max_batch_delay behind it), so
// the slot is seen to stay put although later transactions are done. A
// non-retriable error ends the session before the records behind it go, so
// the connector is seen to retry, session after session, without moving.
func TestPartitionFaultHoldsConfirmedPosition(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  *kerr.Error
		// laterAcked: events after the failed one are delivered during
		// the fault.
		laterAcked bool
	}{
		// franz-go retries this one in place.
		{"retriable NOT_LEADER_FOR_PARTITION", kerr.NotLeaderForPartition, true},
		// franz-go fails the record; the pipeline reconnects and Postgres
		// re-sends from the confirmed position.
		{"non-retriable UNKNOWN_SERVER_ERROR", kerr.UnknownServerError, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := testenv.NewFakeKafka(t)
			e := newEnv(t, k)
			topic := k.Prefix + "outbox.event.order"
			conn := testenv.Connect(t, e.db)
			e.start(t)

			// Find keys on partition 0 and elsewhere, by franz-go's own
			// partitioner.
			part := kgo.StickyKeyPartitioner(nil).ForTopic(topic)
			var bad, good []string
			for i := 0; len(bad) < 1 || len(good) < 20; i++ {
				k := fmt.Sprintf("k-%d", i)
				if part.Partition(&kgo.Record{Key: []byte(k)}, 4) == 0 {
					bad = append(bad, k)
				} else {
					good = append(good, k)
				}
			}
			// Create the topic with a first event, then fault partition 0.
			insertEvent(t, conn, good[0], "Warmup")
			c := k.NewConsumer(t, "^"+strings.ReplaceAll(topic, ".", `\.`)+"$")
			c.WaitCount(t, time.Minute, 1)
			h := k.Fake.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Partitions: []int32{0}, Err: tc.err, Count: -1})

			beforeBad := testenv.CurrentWAL(t, e.db)
			badID, badXID := insertEventTx(t, conn, "order", bad[0], "Stuck", `'{}'`)
			badCommit := testenv.CommitLSN(t, e.db, badXID, beforeBad)
			var goodIDs []string
			for _, g := range good[1:] {
				goodIDs = append(goodIDs, insertEvent(t, conn, g, "Flowing"))
			}
			allGood := func(r []*kgo.Record) bool {
				got := ids(r)
				for _, id := range goodIDs {
					if got[id] == 0 {
						return false
					}
				}
				return true
			}
			if tc.laterAcked {
				c.WaitFor(t, time.Minute, "the healthy partitions' events", allGood)
				testenv.Eventually(t, 30*time.Second, "the fault to be hit", func() bool { return h.Hits() > 0 })
			} else {
				testenv.Eventually(t, time.Minute, "three sessions to hit the fault", func() bool { return h.Hits() >= 3 })
			}
			// Status updates carry the confirmed position: after three
			// more, sent once later transactions were committed (and,
			// with laterAcked, acknowledged), the slot must still stop
			// before the failed one.
			statusUpdates(t, e.db, 3, func() {
				if pos := testenv.SlotPosition(t, e.db, "outbox_cdc"); pos > badCommit {
					t.Fatalf("confirmed_flush_lsn %s passed the failed transaction (commit record at %s)", pos, badCommit)
				}
			})
			if got := ids(c.Records)[badID]; got != 0 {
				t.Fatalf("the faulted event was delivered %d times during the fault", got)
			}

			h.Remove()
			c.WaitFor(t, time.Minute, "every event after the fault cleared", func(r []*kgo.Record) bool { return ids(r)[badID] > 0 && allGood(r) })
			end := testenv.CurrentWAL(t, e.db)
			testenv.Eventually(t, 30*time.Second, "the slot to confirm everything", func() bool {
				return testenv.SlotPosition(t, e.db, "outbox_cdc") >= end
			})
		})
	}
}

// statusUpdates waits until the walsender of slot outbox_cdc has received
// n status updates (its pg_stat_replication.reply_time changed n times, in
// any session), calling look at each look. The first may have been on its
// way before the call: the others were sent after it. With sessions that
// fail and come back, each sends few: a loaded machine took over a minute
// for three, so the deadline is two.
func statusUpdates(t *testing.T, db string, n int, look func()) {
	t.Helper()
	conn := testenv.Connect(t, db)
	var last *time.Time
	seen := -1 // the first reply_time read is no change
	testenv.Eventually(t, 2*time.Minute, fmt.Sprintf("%d status updates", n), func() bool {
		look()
		var reply *time.Time
		if err := conn.QueryRow(context.Background(), `SELECT (SELECT r.reply_time FROM pg_replication_slots s JOIN pg_stat_replication r ON r.pid = s.active_pid
			WHERE s.slot_name = 'outbox_cdc')`).Scan(&reply); err != nil {
			t.Fatal(err)
		}
		if reply != nil && (last == nil || !reply.Equal(*last)) {
			last = reply
			seen++
		}
		return seen >= n
	})
}

// TestPoisonEventStops: an event that cannot form a legal topic stops the
// connector with an error naming it, and the slot does not pass it.
func TestPoisonEventStops(t *testing.T) {
	e := newEnv(t, testenv.NewKafka(t))
	r := e.start(t)
	conn := testenv.Connect(t, e.db)
	ok := insertEvent(t, conn, "p-1", "Fine")
	c := e.kafka.NewConsumer(t, e.kafka.AllTopics())
	c.WaitCount(t, time.Minute, 1)

	before := testenv.CurrentWAL(t, e.db)
	poison, xid := insertEventTx(t, conn, "bad/type", "p-1", "X", `'{}'`)
	poisonCommit := testenv.CommitLSN(t, e.db, xid, before)
	var err error
	select {
	case err = <-r.done:
		close(r.done)
	case <-time.After(time.Minute):
		t.Fatal("the connector kept running past a poison event")
	}
	var ee *outbox.EventError
	if !errors.As(err, &ee) || ee.EventID != poison || !strings.Contains(err.Error(), "bad/type") || !fault.Permanent(err) {
		t.Fatalf("Run returned %v; want a permanent *outbox.EventError for event %s", err, poison)
	}
	if pos := testenv.SlotPosition(t, e.db, "outbox_cdc"); pos > poisonCommit {
		t.Fatalf("confirmed_flush_lsn %s passed the poison event's transaction (commit record at %s)", pos, poisonCommit)
	}
	if !testenv.Pending(t, e.db, "outbox_cdc", "outbox_cdc", poison) {
		t.Fatalf("the slot no longer holds poison event %s: a restart would not see it again", poison)
	}
	c.Settle(t) // the connector stopped: whatever it sent is in Kafka
	if got := ids(c.Records); got[ok] != 1 || len(got) != 1 {
		t.Fatalf("delivered %v", got)
	}
}

// TestGracefulShutdownConfirmsEverything: on shutdown the pipeline waits
// for acks and reports the final position.
func TestGracefulShutdownConfirmsEverything(t *testing.T) {
	e := newEnv(t, testenv.NewKafka(t))
	e.cfg.Postgres.StatusInterval = 30 * time.Second // the most allowed: only the final update can confirm
	e.cfg.Postgres.ConfirmInterval = 30 * time.Second
	r := e.start(t)
	conn := testenv.Connect(t, e.db)
	for i := 0; i < 50; i++ {
		insertEvent(t, conn, fmt.Sprintf("g-%d", i%5), "E")
	}
	c := e.kafka.NewConsumer(t, e.kafka.AllTopics())
	c.WaitCount(t, time.Minute, 50)
	var lastCommit pglogrepl.LSN
	for _, rec := range c.Records {
		if l, _ := pglogrepl.ParseLSN(testenv.Header(rec, route.HeaderCommitLSN)); l > lastCommit {
			lastCommit = l
		}
	}
	testenv.Eventually(t, 30*time.Second, "the tracker to resolve the last transaction", func() bool {
		tr := r.tracker.Load()
		return tr != nil && tr.Confirmed() > lastCommit
	})
	if pos := testenv.SlotPosition(t, e.db, "outbox_cdc"); pos > lastCommit {
		t.Fatalf("slot already at %s before shutdown; the test cannot tell the final update apart", pos)
	}
	if err := r.stop(t); err != nil {
		t.Fatalf("Run returned %v on shutdown, want nil", err)
	}
	// The final update is the last message before the connection's end:
	// the walsender applies it when it reads it, which on a loaded box can
	// be after Run returned. Nothing else moves the slot now (no session,
	// and the 10 s intervals never came), so waiting cannot pass falsely.
	deadline := time.Now().Add(15 * time.Second)
	for pos := testenv.SlotPosition(t, e.db, "outbox_cdc"); pos <= lastCommit; pos = testenv.SlotPosition(t, e.db, "outbox_cdc") {
		if time.Now().After(deadline) {
			t.Fatalf("slot at %s 15 s after shutdown; the last transaction (commit %s) was acked but not confirmed", pos, lastCommit)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestShutdownEndsBetweenTransactions: a shutdown asked for while a
// transaction's events are being sent lets the stream read on to its
// COMMIT, so that the last checkpoint covers all of it, and the next start
// sends none of it again. Cut in the middle, its first events were in
// Kafka but not in the checkpoint, and were sent twice.
func TestShutdownEndsBetweenTransactions(t *testing.T) {
	e := newEnv(t, testenv.NewKafka(t))
	e.cfg.MaxInFlight = 16 // the stream waits for acks inside the transaction
	// The shutdown comes with the transaction's first ack, from the ack
	// itself: the stream is then surely in the middle of it.
	var acked atomic.Int64
	var running atomic.Pointer[running]
	asked := make(chan struct{})
	e.onDelivered = func(_ *kgo.Record, err error) {
		if err == nil && acked.Add(1) == 1 {
			running.Load().cancel()
			close(asked)
		}
	}
	r := e.start(t)
	running.Store(r)
	c := e.kafka.NewConsumer(t, e.kafka.AllTopics())
	const rows = 2000
	testenv.Exec(t, e.db, fmt.Sprintf(`INSERT INTO outbox (aggregatetype, aggregateid, type, payload) SELECT 'order', 'big-' || (i %% 10), 'Created', '{}' FROM generate_series(1, %d) i`, rows))
	select {
	case <-asked:
	case <-time.After(time.Minute):
		t.Fatal("no event of the transaction was acknowledged")
	}
	if err := r.stop(t); err != nil {
		t.Fatalf("Run returned %v on shutdown, want nil", err)
	}
	if n := acked.Load(); n != rows {
		t.Fatalf("%d of the transaction's %d events acknowledged at shutdown, want all", n, rows)
	}
	e.start(t)
	conn := testenv.Connect(t, e.db)
	last := insertEvent(t, conn, "after", "Created")
	// Every event, not only the one after the restart: having read it says
	// nothing of the transaction's events on other partitions, which the
	// consumer reads in no order among them.
	c.WaitFor(t, time.Minute, fmt.Sprintf("the transaction's %d events and the one after the restart", rows), func(recs []*kgo.Record) bool {
		got := ids(recs)
		return got[last] > 0 && len(got) >= rows+1
	})
	c.SettleConfirmed(t, time.Minute, e.db, "outbox_cdc")
	got := ids(c.Records)
	if len(got) != rows+1 {
		t.Errorf("%d distinct events, want %d", len(got), rows+1)
	}
	for id, n := range got {
		if n != 1 {
			t.Errorf("event %s delivered %d times", id, n)
		}
	}
}

// TestConfirmsArePrompt: once Kafka has acked, the checkpoint is written and
// the slot confirmed within a few confirm intervals, however long the
// status interval (docs/design.md, rule 17).
func TestConfirmsArePrompt(t *testing.T) {
	e := newEnv(t, testenv.NewKafka(t))
	e.cfg.Postgres.StatusInterval = 30 * time.Second // the most it may be
	r := e.start(t)
	conn := testenv.Connect(t, e.db)
	ctx := context.Background()
	for round := 0; round < 3; round++ {
		// The event's commit record comes after what its transaction
		// wrote. Not the cluster's WAL end after the commit: other WAL
		// (a checkpoint's running-xacts record, another database) may
		// follow it, and the watermark passes that only on a keepalive,
		// which is checkpointed at the status interval's pace (rule 5).
		var before pglogrepl.LSN
		if err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('order', 'p-1', 'E', '{"k": 1}')`); err != nil {
				return err
			}
			return tx.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()`).Scan(&before)
		}); err != nil {
			t.Fatal(err)
		}
		var commit pglogrepl.LSN
		testenv.Eventually(t, time.Minute, "Kafka to ack the event", func() bool {
			if tr := r.tracker.Load(); tr != nil {
				commit = tr.Position().CommitLSN
			}
			return commit >= before
		})
		// A few confirm intervals (20ms) and a checkpoint's round trip;
		// the status interval used to set the pace. Confirmed positions
		// are transaction ends or keepalive WAL ends, so one past the
		// commit record's start is past the transaction. The deadline is
		// half the status interval: far past what a prompt confirm takes
		// on a loaded machine. A confirm at the status interval's pace
		// may come within it in the first round, but the next round's
		// event is acknowledged just after that status update, a whole
		// interval before the next one.
		testenv.Eventually(t, e.cfg.Postgres.StatusInterval/2, "the slot to confirm the acked event", func() bool {
			return testenv.SlotPosition(t, e.db, "outbox_cdc") > commit
		})
	}
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
}

// TestSlotInUseIsWaitedOut: while another connection holds the slot, the
// pipeline logs why it waits and retries; once the slot is free it streams.
func TestSlotInUseIsWaitedOut(t *testing.T) {
	e := newEnv(t, testenv.NewKafka(t))
	ctx := context.Background()
	if err := e.cfg.Postgres.Validate(); err != nil { // fills the slot and publication defaults
		t.Fatal(err)
	}
	testenv.Exec(t, e.db, `SELECT pg_create_logical_replication_slot('outbox_cdc', 'pgoutput')`)
	st := setup.SlotState{ConfirmedFlush: testenv.SlotPosition(t, e.db, "outbox_cdc")}
	holder, err := wal.Open(ctx, e.cfg.Postgres, st.ConfirmedFlush, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	logs := &testenv.Buffer{}
	r := e.launch(t, logs)
	testenv.Eventually(t, 30*time.Second, "a log line about the slot in use", func() bool {
		return strings.Contains(logs.String(), "replication slot is in use; waiting for it") && strings.Contains(logs.String(), "is active for PID")
	})
	holder.Close(ctx, delivery.NewTracker(st.ConfirmedFlush, 1))
	testenv.Eventually(t, 30*time.Second, "the pipeline to stream once the slot is free", func() bool { return r.tracker.Load() != nil })
	id := insertEvent(t, testenv.Connect(t, e.db), "u-1", "AfterWait")
	c := e.kafka.NewConsumer(t, e.kafka.AllTopics())
	c.WaitCount(t, time.Minute, 1)
	if got := testenv.Header(c.Records[0], route.HeaderID); got != id {
		t.Fatalf("delivered %s, want %s", got, id)
	}
}

// TestSlotVanishedIsFatal: a slot dropped under a running connector stops
// it with an error; it never creates a new slot and carries on.
func TestSlotVanishedIsFatal(t *testing.T) {
	e := newEnv(t, testenv.NewKafka(t))
	r := e.start(t)
	conn := testenv.Connect(t, e.db)
	testenv.Eventually(t, 30*time.Second, "the slot to be dropped", func() bool {
		conn.Exec(context.Background(), `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = 'outbox_cdc' AND active_pid IS NOT NULL`)
		_, err := conn.Exec(context.Background(), `SELECT pg_drop_replication_slot('outbox_cdc')`)
		return err == nil
	})
	var err error
	select {
	case err = <-r.done:
		close(r.done)
	case <-time.After(time.Minute):
		t.Fatal("the connector kept running without its slot")
	}
	if !errors.Is(err, postgres.ErrSlotVanished) || !fault.Permanent(err) {
		t.Fatalf("Run returned %v; want a permanent ErrSlotVanished", err)
	}
	var n int
	testenv.QueryRow(t, e.db, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'outbox_cdc'`, nil, &n)
	if n != 0 {
		t.Fatalf("a new slot was created after the old one vanished")
	}
}

// TestKeepalivesWhileKafkaIsDown: every produce fails retriably, the
// in-flight limit is reached and the loop stops reading, yet status
// updates keep the walsender (wal_sender_timeout = 4s here) from dropping
// the connection; once Kafka recovers everything is delivered in the same
// session.
func TestKeepalivesWhileKafkaIsDown(t *testing.T) {
	// Forty status intervals: a loaded machine's stall of a second or two
	// is not the fault this looks for.
	const walSenderTimeout = 4 * time.Second
	k := testenv.NewFakeKafka(t)
	e := newEnv(t, k)
	e.cfg.Postgres.URL += fmt.Sprintf("&options=-c%%20wal_sender_timeout%%3D%d", walSenderTimeout.Milliseconds())
	e.cfg.Postgres.StatusInterval = 100 * time.Millisecond
	e.cfg.MaxInFlight = 5
	r := e.start(t)
	first := r.tracker.Load()
	conn := testenv.Connect(t, e.db)
	var pid int
	testenv.QueryRow(t, e.db, `SELECT active_pid FROM pg_replication_slots WHERE slot_name = 'outbox_cdc'`, nil, &pid)

	h := k.Fake.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Err: kerr.NotLeaderForPartition, Count: -1})
	var want []string
	for i := 0; i < 40; i++ {
		want = append(want, insertEvent(t, conn, fmt.Sprintf("k-%d", i), "Stalled"))
	}
	testenv.Eventually(t, 30*time.Second, "the in-flight limit to be reached", func() bool { return first.Saturated() })
	// Stay saturated for several wal_sender_timeouts (the fault).
	stallEnd := time.Now().Add(3 * walSenderTimeout)
	for time.Now().Before(stallEnd) {
		var reply time.Time
		var walsender int
		testenv.QueryRow(t, e.db, `SELECT pid, reply_time FROM pg_stat_replication WHERE application_name = 'outbox-cdc'`, nil, &walsender, &reply)
		if walsender != pid {
			t.Fatalf("walsender changed from %d to %d: the connection was dropped while Kafka was down", pid, walsender)
		}
		// A live loop sends one every status_interval (100ms); one
		// that stopped would be dropped at wal_sender_timeout, which a
		// status update older than that means is due.
		if age := time.Since(reply); age >= walSenderTimeout {
			t.Fatalf("last status update %s ago; wal_sender_timeout is %s", age, walSenderTimeout)
		}
		time.Sleep(200 * time.Millisecond) // observation interval, not synchronisation
	}
	if r.tracker.Load() != first {
		t.Fatal("the session restarted while Kafka was down")
	}
	h.Remove()
	c := k.NewConsumer(t, k.AllTopics())
	c.WaitFor(t, time.Minute, "every stalled event", func(recs []*kgo.Record) bool {
		got := ids(recs)
		for _, id := range want {
			if got[id] == 0 {
				return false
			}
		}
		return true
	})
}

// TestDeadLetterPolicy: with on_invalid: dead-letter, a poison event goes to
// the dead-letter topic as its original bytes with headers saying why, the
// stream goes on, and the slot passes the event only once Kafka acked the
// dead-letter record.
func TestDeadLetterPolicy(t *testing.T) {
	k := testenv.NewFakeKafka(t)
	e := newEnv(t, k)
	dlq := k.Prefix + "outbox.dead-letter"
	e.cfg.Tables[0].OnInvalid = outbox.OnInvalidDeadLetter
	e.cfg.Tables[0].DeadLetterTopic = dlq
	e.cfg.Tables = append(e.cfg.Tables, &outbox.Source{MessagePrefix: "outbox", Columns: outbox.DefaultMessageFields,
		Topic: k.Prefix + outbox.DefaultTopic, OnInvalid: outbox.OnInvalidDeadLetter, DeadLetterTopic: dlq})
	// Hold dead-letter writes until the test has looked at the slot.
	h := k.Fake.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: dlq, Err: kerr.NotLeaderForPartition, Count: -1})
	r := e.start(t)
	conn := testenv.Connect(t, e.db)

	before := testenv.CurrentWAL(t, e.db)
	poison, xid := insertEventTx(t, conn, "bad/type", "k-1", "Poison", `'{"keep": "these bytes"}'`)
	poisonCommit := testenv.CommitLSN(t, e.db, xid, before)
	if _, err := conn.Exec(context.Background(), `SELECT pg_logical_emit_message(true, 'outbox', 'not json')`); err != nil {
		t.Fatal(err)
	}
	good := insertEvent(t, conn, "k-1", "Good")

	c := k.NewConsumer(t, k.AllTopics())
	c.WaitFor(t, time.Minute, "the good event after the poison one", func(recs []*kgo.Record) bool { return ids(recs)[good] > 0 })
	testenv.Eventually(t, 30*time.Second, "the dead-letter write to be attempted", func() bool { return h.Hits() > 0 })
	if pos := testenv.SlotPosition(t, e.db, "outbox_cdc"); pos > poisonCommit {
		t.Fatalf("confirmed_flush_lsn %s passed the poison event (commit %s) before its dead-letter record was acked", pos, poisonCommit)
	}
	h.Remove()
	c.WaitFor(t, time.Minute, "two dead-letter records", func(recs []*kgo.Record) bool {
		n := 0
		for _, r := range recs {
			if r.Topic == dlq {
				n++
			}
		}
		return n == 2
	})
	// The two dead letters have different keys, so different partitions:
	// tell them apart by source, not by order.
	var first, second *kgo.Record
	for _, r := range c.Records {
		if r.Topic != dlq {
			continue
		}
		if testenv.Header(r, route.HeaderDeadLetterSource) == "public.outbox" {
			first = r
		} else {
			second = r
		}
	}
	if first == nil || second == nil {
		t.Fatalf("dead letters: row %v, message %v", first, second)
	}
	if string(first.Value) != `{"keep": "these bytes"}` || string(first.Key) != "k-1" ||
		testenv.Header(first, route.HeaderDeadLetterID) != poison || testenv.Header(first, route.HeaderDeadLetterSource) != "public.outbox" ||
		!strings.Contains(testenv.Header(first, route.HeaderDeadLetterError), "bad/type") ||
		testenv.Header(first, route.HeaderDeadLetterLSN) != poisonCommit.String() {
		t.Errorf("dead letter for the row: key %q value %q headers %v", first.Key, first.Value, first.Headers)
	}
	// The headers the record would have had come along (docs/config.md,
	// "Invalid events").
	for h, want := range map[string]string{route.HeaderID: poison, route.HeaderEventType: "Poison",
		route.HeaderAggregateType: "bad/type", route.HeaderCommitLSN: poisonCommit.String()} {
		if got := testenv.Header(first, h); got != want {
			t.Errorf("dead letter header %s = %q, want the original %q", h, got, want)
		}
	}
	if string(second.Value) != "not json" || testenv.Header(second, route.HeaderDeadLetterSource) != `message prefix "outbox"` ||
		!strings.Contains(testenv.Header(second, route.HeaderDeadLetterError), "not a JSON object") {
		t.Errorf("dead letter for the message: value %q headers %v", second.Value, second.Headers)
	}
	end := testenv.CurrentWAL(t, e.db)
	testenv.Eventually(t, 30*time.Second, "the slot to pass everything", func() bool { return testenv.SlotPosition(t, e.db, "outbox_cdc") >= end })
	if r.tracker.Load().Err() != nil {
		t.Fatal(r.tracker.Load().Err())
	}
}
