package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/inbox"
	"github.com/outboxcdc/cdc/internal/testenv"
)

var pg *testenv.Postgres

func TestMain(m *testing.M) { testenv.Main(m, &pg) }

// newDB is a database with the inbox table and an effects table whose
// primary key fails a second application of one event.
func newDB(t *testing.T) string {
	t.Helper()
	db := testenv.Require(t, pg).NewDatabase(t)
	conn := testenv.Connect(t, db)
	if err := (inbox.Inbox{}).Create(context.Background(), conn); err != nil {
		t.Fatal(err)
	}
	testenv.Exec(t, db, `CREATE TABLE effects (event_id text PRIMARY KEY, consumer text NOT NULL)`)
	return db
}

// apply processes eventID in one transaction, the effect being a row in
// effects.
func apply(ctx context.Context, conn *pgx.Conn, consumer, eventID string, fail error) (bool, error) {
	var ran bool
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		var err error
		ran, err = inbox.Process(ctx, tx, consumer, eventID, func(ctx context.Context, tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO effects (event_id, consumer) VALUES ($1, $2)`, eventID, consumer); err != nil {
				return err
			}
			return fail
		})
		return err
	})
	return ran, err
}

func count(t *testing.T, db, sql string) int {
	t.Helper()
	var n int
	testenv.QueryRow(t, db, sql, nil, &n)
	return n
}

// TestRedeliveryAppliesOnce: the same event delivered again does nothing;
// another consumer name applies it for itself; a failed application rolls
// back the id too, so the redelivery applies it.
func TestRedeliveryAppliesOnce(t *testing.T) {
	db := newDB(t)
	conn := testenv.Connect(t, db)
	ctx := context.Background()
	for i, want := range []bool{true, false, false} {
		if ran, err := apply(ctx, conn, "billing", "e-1", nil); err != nil || ran != want {
			t.Fatalf("delivery %d: ran %v, err %v; want ran %v", i+1, ran, err, want)
		}
	}
	testenv.Exec(t, db, `ALTER TABLE effects DROP CONSTRAINT effects_pkey`)
	if ran, err := apply(ctx, conn, "shipping", "e-1", nil); err != nil || !ran {
		t.Fatalf("another consumer: ran %v, err %v; want it applied for shipping", ran, err)
	}
	boom := errors.New("boom")
	if ran, err := apply(ctx, conn, "billing", "e-2", boom); !ran || !errors.Is(err, boom) {
		t.Fatalf("a failing application: ran %v, err %v", ran, err)
	}
	if ran, err := apply(ctx, conn, "billing", "e-2", nil); err != nil || !ran {
		t.Fatalf("after a rollback: ran %v, err %v; want the redelivery applied", ran, err)
	}
	if n := count(t, db, `SELECT count(*) FROM effects`); n != 3 {
		t.Fatalf("%d effects, want 3 (e-1 billing, e-1 shipping, e-2 billing)", n)
	}
}

// TestConcurrentConsumers: 8 instances of one consumer, each on its own
// connection, process the same 200 events at once; each event is applied
// exactly once (the effects table's primary key would fail a second).
func TestConcurrentConsumers(t *testing.T) {
	db := newDB(t)
	ctx := context.Background()
	var wg sync.WaitGroup
	var mu sync.Mutex
	ran := 0
	errs := make(chan error, 8)
	for w := 0; w < 8; w++ {
		conn := testenv.Connect(t, db)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				r, err := apply(ctx, conn, "billing", fmt.Sprintf("e-%d", (i*7+w)%200), nil)
				if err != nil {
					errs <- err
					return
				}
				if r {
					mu.Lock()
					ran++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n := count(t, db, `SELECT count(*) FROM effects`); n != 200 || ran != 200 {
		t.Fatalf("%d effects, fn ran %d times; want 200 and 200", n, ran)
	}
}

// TestCrashBeforeOffsetCommit: a consumer that commits its database
// transactions but dies before committing its Kafka offsets gets the same
// records again from the group; the inbox skips them, and every event is
// applied once.
func TestCrashBeforeOffsetCommit(t *testing.T) {
	db := newDB(t)
	k := testenv.NewKafka(t)
	topic := k.Prefix + "outbox.event.order"
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// The broker creates the topic at the first produce, and answers
	// UNKNOWN_TOPIC_OR_PARTITION until its partitions have leaders, which
	// on a loaded box outlasts franz-go's default four tries: retry until
	// the deadline, as the connector does.
	prod, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers...), kgo.AllowAutoTopicCreation(), kgo.UnknownTopicRetries(-1))
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	for i := 0; i < 100; i++ {
		r := &kgo.Record{Topic: topic, Key: []byte(fmt.Sprintf("agg-%d", i%5)), Value: []byte(`{}`),
			Headers: []kgo.RecordHeader{{Key: "id", Value: []byte(fmt.Sprintf("e-%d", i))}}}
		if err := prod.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	group := "inbox-test-" + strings.TrimSuffix(k.Prefix, ".")
	conn := testenv.Connect(t, db)
	// consume applies records until stop says so, committing offsets only
	// when commit is true; it returns how many records it saw.
	consume := func(stopAfter int, commit bool) int {
		cl, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers...), kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.DisableAutoCommit(), kgo.FetchMaxWait(200*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		seen := 0
		deadline := time.Now().Add(time.Minute)
		for seen < stopAfter && time.Now().Before(deadline) {
			pctx, cancel := context.WithTimeout(ctx, time.Second)
			fs := cl.PollFetches(pctx)
			cancel()
			for _, r := range fs.Records() {
				id, err := inbox.RecordEventID(r)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := apply(ctx, conn, "billing", id, nil); err != nil {
					t.Fatal(err)
				}
				seen++
			}
			if commit {
				if err := cl.CommitUncommittedOffsets(ctx); err != nil {
					t.Fatal(err)
				}
			}
		}
		return seen
	}
	if seen := consume(40, false); seen < 40 {
		t.Fatalf("the first consumer saw %d records before its crash", seen)
	}
	// It "crashed": its transactions committed, its offsets did not. The
	// next one starts from the start again.
	if seen := consume(100, true); seen != 100 {
		t.Fatalf("the second consumer saw %d records, want all 100 again", seen)
	}
	if n := count(t, db, `SELECT count(*) FROM effects`); n != 100 {
		t.Fatalf("%d effects, want each of the 100 events applied once", n)
	}
}

func TestEventID(t *testing.T) {
	for _, tc := range []struct {
		name    string
		headers []inbox.Header
		value   string
		want    string
	}{
		{"id header", []inbox.Header{{Key: "event_type", Value: []byte("E")}, {Key: "id", Value: []byte("a")}}, `{"id": "payload"}`, "a"},
		{"seed 004's header", []inbox.Header{{Key: "x-event-id", Value: []byte("b")}}, `{}`, "b"},
		{"CloudEvents binary", []inbox.Header{{Key: "ce_id", Value: []byte("c")}}, `{}`, "c"},
		{"envelope", nil, `{"event_id": "d", "aggregate_id": "x"}`, "d"},
		{"CloudEvents structured", nil, `{"specversion": "1.0", "id": "e", "data": {}}`, "e"},
		{"a payload's own id is not the event's", nil, `{"id": "order-7"}`, ""},
	} {
		got, err := inbox.EventID(tc.headers, []byte(tc.value))
		if got != tc.want || (tc.want == "") != errors.Is(err, inbox.ErrNoEventID) {
			t.Errorf("%s: %q, %v; want %q", tc.name, got, err, tc.want)
		}
	}
}

// TestCleanup deletes ids older than the retention and keeps the rest; a
// bad table name is refused.
func TestCleanup(t *testing.T) {
	db := newDB(t)
	testenv.Exec(t, db, `INSERT INTO event_inbox (consumer_name, event_id, processed_at)
		SELECT 'billing', 'old-' || i, now() - interval '8 days' FROM generate_series(1, 25000) i`,
		`INSERT INTO event_inbox (consumer_name, event_id) VALUES ('billing', 'new')`)
	n, err := (inbox.Inbox{}).Cleanup(context.Background(), testenv.Connect(t, db), 7*24*time.Hour)
	if err != nil || n != 25000 {
		t.Fatalf("cleaned %d, err %v; want 25000", n, err)
	}
	if left := count(t, db, `SELECT count(*) FROM event_inbox`); left != 1 {
		t.Fatalf("%d ids left, want the new one", left)
	}
	if _, err := (inbox.Inbox{Table: "x; DROP TABLE effects"}).DDL(); err == nil {
		t.Fatal("a table name that is not an identifier was accepted")
	}
}
