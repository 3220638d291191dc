package pipeline_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/pipeline"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// Seed 003's event_outbox: a poller marks rows published; pending ones have
// published_at NULL.
const pollerSchema = `
CREATE TABLE event_outbox (
  id serial PRIMARY KEY,
  aggregate_type text NOT NULL,
  aggregate_id text NOT NULL,
  event_type text NOT NULL,
  payload jsonb NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now(),
  published_at timestamptz
);`

func pollerTable(prefix string, b *outbox.Backfill) *outbox.Table {
	return &outbox.Table{
		Name: outbox.TableName{Schema: "public", Name: "event_outbox"},
		Columns: outbox.Columns{outbox.FieldID: "id", outbox.FieldAggregateType: "aggregate_type", outbox.FieldAggregateID: "aggregate_id",
			outbox.FieldEventType: "event_type", outbox.FieldPayload: "payload"},
		Topic:    prefix + outbox.DefaultTopic,
		Backfill: b,
	}
}

// seqPayload is an event of aggregate agg with its sequence number.
func seqPayload(agg string, seq int) string { return fmt.Sprintf(`{"agg": "%s", "seq": %d}`, agg, seq) }

type seqEvent struct {
	Agg string `json:"agg"`
	Seq int    `json:"seq"`
}

// backfillWriters runs n writers, each owning the aggregates a%n == w, so
// that each aggregate's commit order is its sequence order; next[a] is the
// next sequence number of aggregate a. They insert pending rows until stop
// is closed, and report every id they committed.
func backfillWriters(t *testing.T, db string, n, aggs int, next []int, stop <-chan struct{}) (wait func() map[string]bool, count *atomic.Int64) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	committed := map[string]bool{}
	count = &atomic.Int64{}
	for w := 0; w < n; w++ {
		conn := connect(t, db)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				a := w + n*(i%(aggs/n))
				agg := fmt.Sprintf("agg-%d", a)
				var id int
				err := conn.QueryRow(context.Background(), `INSERT INTO event_outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', $1, 'live', $2) RETURNING id`,
					agg, seqPayload(agg, next[a])).Scan(&id)
				if err != nil {
					t.Error(err)
					return
				}
				next[a]++
				mu.Lock()
				committed[fmt.Sprint(id)] = true
				mu.Unlock()
				count.Add(1)
			}
		}()
	}
	return func() map[string]bool { wg.Wait(); return committed }, count
}

// TestFirstStartBackfill is issue 12's adoption: 10,000 pending and 10,000
// published rows are in the table, and 4 writers insert while the
// connector starts for the first time with backfill.where published_at IS
// NULL. Every pending row and every new row arrives exactly once, no
// published row arrives, and each aggregate's events arrive in sequence
// order, the backfilled ones before the newer live ones.
func TestFirstStartBackfill(t *testing.T) {
	kafka := testenv.NewKafka(t)
	p := testenv.Require(t, pg)
	db := p.NewDatabase(t)
	testenv.Exec(t, db, pollerSchema)
	const aggs, perAgg = 200, 100 // 20,000 rows, every other one published
	next := make([]int, aggs)
	testenv.Exec(t, db, fmt.Sprintf(`
		INSERT INTO event_outbox (aggregate_type, aggregate_id, event_type, payload, published_at)
		SELECT 'order', 'agg-' || a, 'old', jsonb_build_object('agg', 'agg-' || a, 'seq', s),
		       CASE WHEN s %% 2 = 1 THEN now() END
		FROM generate_series(0, %d) s, generate_series(0, %d) a ORDER BY s, a`, perAgg-1, aggs-1))
	for a := range next {
		next[a] = perAgg
	}
	var pending []string
	testenv.QueryRow(t, db, `SELECT array_agg(id::text) FROM event_outbox WHERE published_at IS NULL`, nil, &pending)
	if len(pending) != 10000 {
		t.Fatalf("%d pending rows, want 10000", len(pending))
	}

	stop := make(chan struct{})
	wait, written := backfillWriters(t, db, 4, aggs, next, stop)
	testenv.Eventually(t, 10*time.Second, "the writers to start", func() bool { return written.Load() > 50 })

	e := &env{db: db, kafka: kafka, cfg: newEnvConfig(db, kafka)}
	e.cfg.Tables = []*outbox.Table{pollerTable(kafka.Prefix, &outbox.Backfill{Where: "published_at IS NULL", OrderBy: []string{"id"}, ChunkSize: 500})}
	r := e.start(t)
	// Let the writers go on after the stream started, then stop them.
	atStart := written.Load()
	testenv.Eventually(t, 30*time.Second, "live rows after the start", func() bool { return written.Load() > atStart+200 })
	close(stop)
	live := wait()

	want := len(pending) + len(live)
	c := kafka.NewConsumer(t, kafka.AllTopics())
	c.WaitCount(t, 2*time.Minute, want)
	c.Settle(time.Second)
	if len(c.Records) != want {
		t.Errorf("%d records, want %d (10,000 pending and %d live rows)", len(c.Records), want, len(live))
	}
	got := map[string]int{}
	last := map[string]int{}
	for _, rec := range c.Records {
		id := testenv.Header(rec, "id")
		got[id]++
		var ev seqEvent
		if err := json.Unmarshal(rec.Value, &ev); err != nil {
			t.Fatalf("record %s: %v", id, err)
		}
		if string(rec.Key) != ev.Agg || rec.Topic != kafka.Prefix+"outbox.event.order" {
			t.Fatalf("record %s: topic %s key %s, want %soutbox.event.order and %s", id, rec.Topic, rec.Key, kafka.Prefix, ev.Agg)
		}
		if prev, ok := last[ev.Agg]; ok && ev.Seq <= prev {
			t.Errorf("%s: seq %d after %d: out of order", ev.Agg, ev.Seq, prev)
		}
		last[ev.Agg] = ev.Seq
		if ev.Seq < perAgg && ev.Seq%2 == 1 {
			t.Errorf("published row %s (%s seq %d) was sent", id, ev.Agg, ev.Seq)
		}
	}
	for _, id := range pending {
		if got[id] != 1 {
			t.Errorf("pending row %s arrived %d times", id, got[id])
		}
	}
	for id := range live {
		if got[id] != 1 {
			t.Errorf("live row %s arrived %d times", id, got[id])
		}
	}
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	// The backfilled records carry the slot's consistent point as their
	// commit LSN, below every live one's; the checkpoint says the backfill
	// finished, and counts them: the pending rows and the writers' rows
	// committed before the slot.
	var first pglogrepl.LSN
	byLSN := map[pglogrepl.LSN]int64{}
	for _, rec := range c.Records {
		lsn, err := pglogrepl.ParseLSN(testenv.Header(rec, "commit_lsn"))
		if err != nil {
			t.Fatal(err)
		}
		byLSN[lsn]++
		if first == 0 || lsn < first {
			first = lsn
		}
	}
	rec, _ := loadCheckpoint(t, e)
	if len(rec.Backfills) != 1 || !rec.Backfills[0].Done() || !rec.Backfills[0].Initial || rec.Backfills[0].Rows != byLSN[first] || byLSN[first] < 10000 {
		t.Errorf("checkpoint backfills %+v, want one finished initial job of the %d records at %s (at least 10000)", rec.Backfills, byLSN[first], first)
	}
	t.Logf("%d rows backfilled, %d live", byLSN[first], int64(want)-byLSN[first])
}

// TestBackfillBadInput: a condition that does not parse, a column that does
// not exist, and a nullable order_by column are refused before anything is
// sent, each in one line that says what to fix.
func TestBackfillBadInput(t *testing.T) {
	kafka := testenv.NewFakeKafka(t)
	p := testenv.Require(t, pg)
	db := p.NewDatabase(t)
	testenv.Exec(t, db, pollerSchema, `ALTER TABLE event_outbox ADD COLUMN note_at timestamptz`,
		`INSERT INTO event_outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', 'a', 'x', '{}')`)
	for _, tc := range []struct {
		b    outbox.Backfill
		want string
	}{
		{outbox.Backfill{Where: "published_at IS NUL"}, `the condition "published_at IS NUL" does not work: syntax error`},
		{outbox.Backfill{Where: "processed = false"}, `column "processed" does not exist`},
		{outbox.Backfill{OrderBy: []string{"created"}}, `no column created`},
		{outbox.Backfill{OrderBy: []string{"note_at"}}, `column note_at can be NULL`},
	} {
		e := &env{db: db, kafka: kafka, cfg: newEnvConfig(db, kafka)}
		e.cfg.Tables = []*outbox.Table{pollerTable(kafka.Prefix, &tc.b)}
		e.cfg.Postgres.Slot = fmt.Sprintf("bad_%d", time.Now().UnixNano())
		r := e.launch(t, ioDiscard{})
		err := waitFatal(t, r)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("backfill %+v: error %v, want one line with %q", tc.b, err, tc.want)
		}
		if !pipeline.Permanent(err) {
			t.Errorf("backfill %+v: %v is retried, want it fatal", tc.b, err)
		}
	}
	c := kafka.NewConsumer(t, kafka.AllTopics())
	c.Settle(500 * time.Millisecond)
	for _, rec := range c.Records {
		if !strings.HasPrefix(rec.Topic, "checkpoints") {
			t.Errorf("record sent to %s despite the refused backfill", rec.Topic)
		}
	}
}

type ioDiscard struct{}

func (ioDiscard) Write(p []byte) (int, error) { return len(p), nil }
