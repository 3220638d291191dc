package pipeline_test

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pglogrepl"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/config"
	"github.com/outboxcdc/cdc/internal/fault"
	"github.com/outboxcdc/cdc/internal/postgres"

	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/pipeline"
	"github.com/outboxcdc/cdc/internal/route"
	"github.com/outboxcdc/cdc/internal/tableread"
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

func pollerTable(prefix string, b *outbox.BackfillOptions) *outbox.Source {
	return &outbox.Source{
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
		conn := testenv.Connect(t, db)
		wg.Add(1)
		go func() {
			defer wg.Done()
			// About 250 rows a second each: a busy table, which the
			// stream keeps up with on a small machine.
			tick := time.NewTicker(4 * time.Millisecond)
			defer tick.Stop()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				a := w + n*(i%(aggs/n))
				agg := fmt.Sprintf("agg-%d", a)
				var id string
				err := conn.QueryRow(context.Background(), `INSERT INTO event_outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', $1, 'live', $2) RETURNING id::text`,
					agg, seqPayload(agg, next[a])).Scan(&id)
				if err != nil {
					t.Error(err)
					return
				}
				next[a]++
				mu.Lock()
				committed[id] = true
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
func TestFirstStartBackfill(t *testing.T) { firstStartBackfill(t, false) }

// TestFirstStartBackfillExactlyOnce: the same in exactly-once mode, read
// by a read_committed consumer: the backfill's chunks are committed with
// the checkpoint that counts them.
func TestFirstStartBackfillExactlyOnce(t *testing.T) { firstStartBackfill(t, true) }

func firstStartBackfill(t *testing.T, exactlyOnce bool) {
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
	testenv.Eventually(t, time.Minute, "the writers to start", func() bool { return written.Load() > 50 })

	e := &env{db: db, kafka: kafka, cfg: newEnvConfig(testenv.LeastPrivileged(t, db, "event_outbox", true), kafka)}
	e.cfg.Tables = []*outbox.Source{pollerTable(kafka.Prefix, &outbox.BackfillOptions{Where: "published_at IS NULL", OrderBy: []string{"id"}, ChunkSize: 500})}
	if exactlyOnce {
		e.cfg.Delivery = config.DeliveryExactlyOnce
	}
	r := e.start(t)
	// Let the writers go on after the stream started, then stop them.
	atStart := written.Load()
	testenv.Eventually(t, 30*time.Second, "live rows after the start", func() bool { return written.Load() > atStart+200 })
	close(stop)
	live := wait()

	want := len(pending) + len(live)
	c := kafka.NewConsumer(t, kafka.AllTopics())
	if exactlyOnce {
		c = kafka.NewCommittedConsumer(t, kafka.AllTopics())
	}
	c.WaitCount(t, 2*time.Minute, want)
	c.SettleConfirmed(t, time.Minute, db, "outbox_cdc")
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
		b    outbox.BackfillOptions
		want string
	}{
		{outbox.BackfillOptions{Where: "published_at IS NUL"}, `the condition "published_at IS NUL" does not work: syntax error`},
		{outbox.BackfillOptions{Where: "processed = false"}, `column "processed" does not exist`},
		{outbox.BackfillOptions{OrderBy: []string{"created"}}, `no column created`},
		{outbox.BackfillOptions{OrderBy: []string{"note_at"}}, `column note_at can be NULL`},
	} {
		e := &env{db: db, kafka: kafka, cfg: newEnvConfig(db, kafka)}
		e.cfg.Tables = []*outbox.Source{pollerTable(kafka.Prefix, &tc.b)}
		e.cfg.Postgres.Slot = fmt.Sprintf("bad_%d", time.Now().UnixNano())
		// cdc check lists it,
		chk, err := pipeline.New(e.cfg, hclog.NewNullLogger(), pipeline.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := chk.Ops().Check(context.Background()); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("check of backfill %+v: %v, want a problem with %q", tc.b, err, tc.want)
		}
		// and cdc run stops on it before creating anything.
		r := e.launch(t, ioDiscard{})
		err = waitFatal(t, r)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("backfill %+v: error %v, want one line with %q", tc.b, err, tc.want)
		}
		if !fault.Permanent(err) {
			t.Errorf("backfill %+v: %v is retried, want it fatal", tc.b, err)
		}
		var exists bool
		testenv.QueryRow(t, db, `SELECT exists(SELECT FROM pg_replication_slots WHERE slot_name = $1)`, []any{e.cfg.Postgres.Slot}, &exists)
		if exists {
			t.Errorf("backfill %+v: the slot was created despite the error", tc.b)
		}
	}
	c := kafka.NewConsumer(t, kafka.AllTopics())
	c.Settle(t)
	for _, rec := range c.Records {
		if !strings.HasPrefix(rec.Topic, "checkpoints") {
			t.Errorf("record sent to %s despite the refused backfill", rec.Topic)
		}
	}
}

type ioDiscard struct{}

func (ioDiscard) Write(p []byte) (int, error) { return len(p), nil }

// TestBackfillBesideStream: cdc backfill's job, while 4 writers insert.
// 5,000 rows committed before the slot are each sent once. A live row is
// sent by the stream, and again by a chunk only when it committed before
// that chunk's low watermark (a backfill re-sends what matches); a row
// that committed between a chunk's watermarks is never sent twice (with
// random keys, live rows fall inside the chunks being read), and no
// backfilled copy arrives before the live one: within each aggregate the
// first arrivals keep commit order.
func TestBackfillBesideStream(t *testing.T) {
	kafka := testenv.NewKafka(t)
	p := testenv.Require(t, pg)
	db := p.NewDatabase(t)
	// Random keys, and the order of them (an order_by, read in keyset
	// chunks): live rows land between the keys of old ones, inside the
	// chunks being read, so the watermarks have work to do.
	testenv.Exec(t, db, strings.Replace(pollerSchema, "id serial PRIMARY KEY", "id uuid PRIMARY KEY DEFAULT gen_random_uuid()", 1))
	const aggs, perAgg = 100, 50
	testenv.Exec(t, db, fmt.Sprintf(`
		INSERT INTO event_outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'order', 'agg-' || a, 'old', jsonb_build_object('agg', 'agg-' || a, 'seq', s)
		FROM generate_series(0, %d) s, generate_series(0, %d) a ORDER BY s, a`, perAgg-1, aggs-1))
	var old []string
	testenv.QueryRow(t, db, `SELECT array_agg(id::text) FROM event_outbox`, nil, &old)

	type window struct{ low, high pglogrepl.LSN }
	var mu sync.Mutex
	var windows []window
	e := &env{db: db, kafka: kafka, cfg: newEnvConfig(testenv.LeastPrivileged(t, db, "event_outbox", true), kafka)}
	e.cfg.Tables = []*outbox.Source{pollerTable(kafka.Prefix, nil)}
	e.onChunk = func(low, high pglogrepl.LSN, read, sent int) {
		mu.Lock()
		windows = append(windows, window{low, high})
		mu.Unlock()
	}
	// The first start, without a backfill, creates the slot after the
	// old rows; the second has the table's chunk size for cdc backfill.
	if err := e.start(t).stop(t); err != nil {
		t.Fatal(err)
	}
	e.cfg.Tables = []*outbox.Source{pollerTable(kafka.Prefix, &outbox.BackfillOptions{ChunkSize: 200, OrderBy: []string{"id"}})}
	r := e.start(t)

	next := make([]int, aggs)
	for a := range next {
		next[a] = perAgg
	}
	stop := make(chan struct{})
	wait, written := backfillWriters(t, db, 4, aggs, next, stop)
	testenv.Eventually(t, time.Minute, "the writers to start", func() bool { return written.Load() > 100 })

	// As cdc backfill does: another pipeline of the same config asks.
	cfg := e.cfg
	admin, err := pipeline.New(cfg, hclog.NewNullLogger(), pipeline.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	req, err := admin.Ops().RequestBackfill(ctx, cfg.Tables[0], "")
	if err != nil {
		t.Fatal(err)
	}
	job, err := admin.Ops().WatchBackfill(ctx, req, func(checkpoint.Job) {})
	if err != nil {
		t.Fatal(err)
	}
	close(stop)
	live := wait()
	if len(windows) < 10 {
		t.Fatalf("%d chunks, want at least 10", len(windows))
	}

	c := kafka.NewConsumer(t, kafka.AllTopics())
	c.WaitFor(t, time.Minute, "every row", func(recs []*kgo.Record) bool {
		seen := map[string]bool{}
		for _, r := range recs {
			seen[testenv.Header(r, "id")] = true
		}
		for _, id := range old {
			if !seen[id] {
				return false
			}
		}
		for id := range live {
			if !seen[id] {
				return false
			}
		}
		return true
	})
	// Stopped, the pipeline owes nothing: what it sent is in Kafka.
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	c.Settle(t)

	copies := map[string][]pglogrepl.LSN{}
	firstSeq := map[string]int{}
	for _, rec := range c.Records {
		id := testenv.Header(rec, "id")
		lsn, err := pglogrepl.ParseLSN(testenv.Header(rec, "commit_lsn"))
		if err != nil {
			t.Fatal(err)
		}
		first := len(copies[id]) == 0
		copies[id] = append(copies[id], lsn)
		var ev seqEvent
		if err := json.Unmarshal(rec.Value, &ev); err != nil {
			t.Fatal(err)
		}
		if first && live[id] {
			if prev, ok := firstSeq[ev.Agg]; ok && ev.Seq <= prev {
				t.Errorf("%s: live seq %d arrived after %d", ev.Agg, ev.Seq, prev)
			}
			firstSeq[ev.Agg] = ev.Seq
		}
	}
	for _, id := range old {
		if n := len(copies[id]); n != 1 {
			t.Errorf("row %s from before the slot arrived %d times, want once", id, n)
		}
	}
	// inWindow: committed between some chunk's watermarks.
	inWindow := func(lsn pglogrepl.LSN) bool {
		for _, w := range windows {
			if lsn > w.low && lsn < w.high {
				return true
			}
		}
		return false
	}
	doubled, within := 0, 0
	for id := range live {
		cs := copies[id]
		switch {
		case len(cs) > 2:
			t.Errorf("live row %s arrived %d times", id, len(cs))
		case len(cs) == 2:
			doubled++
			if cs[1] <= cs[0] {
				t.Errorf("live row %s: its backfilled copy (commit lsn %s) came before the live one (%s)", id, cs[1], cs[0])
			}
			// The chunk that re-sent it is the one whose high watermark is
			// the copy's commit LSN.
			for _, w := range windows {
				if w.high == cs[1] && cs[0] > w.low {
					t.Errorf("live row %s committed at %s, between the watermarks (%s, %s) of the chunk that sent it again", id, cs[0], w.low, w.high)
				}
			}
		}
		if len(cs) > 0 && inWindow(cs[0]) {
			within++
		}
	}
	if job.Rows < int64(len(old)) || !job.Done() {
		t.Errorf("job %+v: want it done with at least %d rows", job, len(old))
	}
	t.Logf("%d chunks; %d old rows; %d live rows, %d of them re-sent by the backfill, %d committed between watermarks", len(windows), len(old), len(live), doubled, within)
}

// TestBackfillRequestOffTheLoop (issue 23, item 11): the checkpoint topic
// holds 100,000 superseded records of another pipeline. A backfill request
// is read off the replication loop (a follower has read it by the time
// the WAL announces it, or does within one of its fetches), so live events
// keep flowing while it is taken. The loop used to read the whole topic
// itself.
//
// The loop asks the follower once at most (request.Gate.Lookups: the
// follower had not read the request yet, a race the design allows), and
// no session ended. How long live events waited is logged, not bounded: on
// kfake the whole topic reads in about 0.1 s, less than a live event's
// commit -> ack beside the backfill (about 0.4 s), and both grow with the
// machine's load, so no bound tells the two apart.
func TestBackfillRequestOffTheLoop(t *testing.T) {
	kafka := testenv.NewKafka(t)
	db := testenv.Require(t, pg).NewDatabase(t)
	testenv.Exec(t, db, pollerSchema, `INSERT INTO event_outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'order', 'agg-' || (i % 10), 'old', jsonb_build_object('i', i) FROM generate_series(1, 500) i`)
	e := &env{db: db, kafka: kafka, cfg: newEnvConfig(db, kafka)}
	e.cfg.Tables = []*outbox.Source{pollerTable(kafka.Prefix, &outbox.BackfillOptions{ChunkSize: 100})}
	var worst atomic.Int64 // the longest commit -> ack of a live event, in ns
	e.onDelivered = func(rec *kgo.Record, err error) {
		if err == nil && string(rec.Value) != "" && strings.Contains(string(rec.Value), `"live"`) {
			if d := int64(time.Since(rec.Timestamp)); d > worst.Load() {
				worst.Store(d)
			}
		}
	}
	// The first start creates the slot after the old rows: only a
	// request sends them.
	r := e.start(t)

	cl := kafka.Client(t)
	old := checkpoint.Record{Slot: "another_pipeline", SystemID: "7000000000000000002", Timeline: 1, UpdatedAt: time.Now()}
	for i := 0; i < 100_000; i++ {
		old.Confirmed = pglogrepl.LSN(i)
		v, err := json.Marshal(old)
		if err != nil {
			t.Fatal(err)
		}
		cl.Produce(context.Background(), &kgo.Record{Topic: e.cfg.Checkpoint.Topic, Key: []byte(old.Key()), Value: v}, func(_ *kgo.Record, err error) {
			if err != nil {
				t.Error(err)
			}
		})
	}
	if err := cl.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	// What a loop that read the topic itself would hold a live event
	// for: reading it to its end, measured here, on this machine.
	reading := time.Now()
	kafka.NewConsumer(t, "^"+regexp.QuoteMeta(e.cfg.Checkpoint.Topic)+"$").Settle(t)
	readAll := time.Since(reading)

	stop := make(chan struct{})
	live, wait := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(wait)
		conn := testenv.Connect(t, db)
		tick := time.NewTicker(10 * time.Millisecond) // the writer's pace, not a synchronisation
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			if _, err := conn.Exec(context.Background(), `INSERT INTO event_outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', 'agg-live', 'live', jsonb_build_object('live', $1::int))`, i); err != nil {
				t.Error(err)
				return
			}
			if i == 50 {
				close(live)
			}
		}
	}()
	<-live
	admin, err := pipeline.New(e.cfg, hclog.NewNullLogger(), pipeline.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	req, err := admin.Ops().RequestBackfill(ctx, e.cfg.Tables[0], "")
	if err != nil {
		t.Fatal(err)
	}
	job, err := admin.Ops().WatchBackfill(ctx, req, func(checkpoint.Job) {})
	if err != nil {
		t.Fatal(err)
	}
	close(stop)
	<-wait
	if job.Rows < 500 {
		t.Errorf("the backfill sent %d rows, want the 500 old ones at least", job.Rows)
	}
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	t.Logf("100,000 superseded records in the checkpoint topic (read in %s): the longest commit -> ack of a live event during the request was %s",
		readAll.Round(time.Millisecond), time.Duration(worst.Load()).Round(time.Millisecond))
	if n := r.p.RequestLookupsForTest(); n > 1 {
		t.Errorf("the replication loop looked the request up %d times; want once at most, the follower answering", n)
	}
	if n := counterValue(r.p.Metrics().Restarts); n != 0 {
		t.Errorf("%v sessions restarted while the request was taken", n)
	}
}

// TestBackfillConditionIsContained (issue 24): a condition runs as the
// connector's role, which can read every table, so it is kept inside its
// WHERE, in a read-only transaction, under backfill.statement_timeout.
func TestBackfillConditionIsContained(t *testing.T) {
	kafka := testenv.NewKafka(t)
	db := testenv.Require(t, pg).NewDatabase(t)
	testenv.Exec(t, db, pollerSchema, `CREATE SEQUENCE side_effect`, `INSERT INTO event_outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'order', 'agg-1', 'old', '{}' FROM generate_series(1, 10)`)
	cfg := newEnvConfig(db, kafka)
	cfg.Tables = []*outbox.Source{pollerTable(kafka.Prefix, &outbox.BackfillOptions{ChunkSize: 100})}
	cfg.Backfill.StatementTimeout = time.Second
	e := &env{db: db, kafka: kafka, cfg: cfg}
	e.start(t)
	admin, err := pipeline.New(cfg, hclog.NewNullLogger(), pipeline.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, tt := range []struct{ where, want string }{
		{"true) --", "closes a parenthesis it did not open"},
		{"true) OR (true", "closes a parenthesis it did not open"},
		{"true; SELECT 1", "contains ';'"},
		{"nextval('side_effect') > 0", "read-only transaction"},
		{"(SELECT count(*) FROM generate_series(1, 1000000000)) > 0", "statement timeout"},
		{"pg_sleep(5) IS NOT NULL", "calls pg_sleep"},
	} {
		_, err := admin.Ops().RequestBackfill(ctx, cfg.Tables[0], tt.where)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("backfill where %q: %v; want an error saying %q", tt.where, err, tt.want)
		}
	}
	var used bool
	testenv.QueryRow(t, db, `SELECT is_called FROM side_effect`, nil, &used)
	if used {
		t.Error("a condition wrote: the sequence was advanced")
	}
}

// TestBackfillColumnNamedUser (issue 24): the aggregate id lives in a
// column named user, a reserved word. The first start's backfill keys each
// event by that column's value; the statement used to name it bare, which
// Postgres reads as the role's name.
func TestBackfillColumnNamedUser(t *testing.T) {
	kafka := testenv.NewKafka(t)
	db := testenv.Require(t, pg).NewDatabase(t)
	testenv.Exec(t, db, `CREATE TABLE events (id serial PRIMARY KEY, kind text NOT NULL, "user" text NOT NULL, "order" text NOT NULL, payload jsonb NOT NULL)`,
		`INSERT INTO events (kind, "user", "order", payload) SELECT 'account', 'user-' || i, 'Created', jsonb_build_object('i', i) FROM generate_series(1, 200) i`)
	cfg := newEnvConfig(db, kafka)
	cfg.Tables = []*outbox.Source{{
		Name: outbox.TableName{Schema: "public", Name: "events"},
		Columns: outbox.Columns{outbox.FieldID: "id", outbox.FieldAggregateType: "kind", outbox.FieldAggregateID: "user",
			outbox.FieldEventType: "order", outbox.FieldPayload: "payload"},
		Topic:    kafka.Prefix + outbox.DefaultTopic,
		Backfill: &outbox.BackfillOptions{OrderBy: []string{"id"}, ChunkSize: 50},
	}}
	e := &env{db: db, kafka: kafka, cfg: cfg}
	e.start(t)
	c := kafka.NewConsumer(t, kafka.AllTopics())
	c.WaitCount(t, time.Minute, 200)
	keys := map[string]bool{}
	for _, r := range c.Records {
		var p struct{ I int }
		if err := json.Unmarshal(r.Value, &p); err != nil {
			t.Fatal(err)
		}
		if want := fmt.Sprintf("user-%d", p.I); string(r.Key) != want || testenv.Header(r, route.HeaderEventType) != "Created" {
			t.Fatalf("record %d: key %q, type %q; want %q and Created (the columns' values)", p.I, r.Key, testenv.Header(r, route.HeaderEventType), want)
		}
		keys[string(r.Key)] = true
	}
	if len(keys) != 200 {
		t.Errorf("%d distinct keys, want 200", len(keys))
	}
}

// TestBackfillChunksBoundedInBytes (issue 38): a chunk holds about the
// byte budget of rows, whatever their size: 1 MB rows come a few at a
// time under a 2 MB budget; a chunk ends with the row that reaches the
// budget, so a 5 MB row, larger than the budget, still goes, last in its
// chunk; every row is read once, in key order, and the chunk's row count
// follows the rows' size (small rows fill whole chunks again). So in
// keyset chunks (order_by), and from a Cursor (the commit order), held
// beside the stream and in a snapshot's transaction: the rows it reads
// past the budget are read again from there.
func TestBackfillChunksBoundedInBytes(t *testing.T) {
	db := testenv.Require(t, pg).NewDatabase(t)
	testenv.Exec(t, db, pollerSchema, `INSERT INTO event_outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'order', 'agg-' || i, 'big', jsonb_build_object('blob', repeat('x', CASE WHEN i = 20 THEN 5000000 WHEN i <= 40 THEN 1000000 ELSE 100 END))
		FROM generate_series(1, 3000) i`)
	ctx := context.Background()
	cfg := newEnvConfig(db, testenv.NewKafka(t))
	if err := cfg.Postgres.Validate(); err != nil {
		t.Fatal(err)
	}
	conn, err := postgres.ConnectRows(ctx, cfg.Postgres, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	tbl := pollerTable("", nil)
	if err := tbl.Validate(); err != nil {
		t.Fatal(err)
	}
	const budget = 2 << 20
	for _, tc := range []struct {
		name  string
		order tableread.Order
		tx    bool // the cursor in a transaction, as a snapshot's
	}{{"keyset", tableread.OrderColumns, false}, {"cursor", tableread.OrderAuto, false}, {"cursor in a transaction", tableread.OrderAuto, true}} {
		t.Run(tc.name, func(t *testing.T) {
			plan, err := tableread.NewPlan(ctx, conn, tbl, "", nil, tc.order, 1000)
			if err != nil {
				t.Fatal(err)
			}
			plan.SetBudget(budget)
			read := func(after []string) (tableread.Chunk, error) { return plan.Read(ctx, conn, after, nil) }
			if plan.InCommitOrder() {
				if tc.tx {
					if _, err := conn.Exec(ctx, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"); err != nil {
						t.Fatal(err)
					}
					defer conn.Exec(ctx, "ROLLBACK")
				}
				cur, err := plan.Open(ctx, conn, nil, 0, false)
				if err != nil {
					t.Fatal(err)
				}
				defer cur.Close(ctx)
				read = func([]string) (tableread.Chunk, error) { return cur.Next(ctx) }
			}
			var after []string
			next, maxRows := 1, 0
			for {
				c, err := read(after)
				if err != nil {
					t.Fatal(err)
				}
				size, last := 0, 0
				for _, row := range c.Rows {
					n := 0
					for _, v := range row {
						n += len(v)
					}
					size, last = size+n, n
					var id int
					fmt.Sscan(string(row[0]), &id)
					if id != next {
						t.Fatalf("row %d, want %d: skipped or read twice", id, next)
					}
					next++
				}
				if size-last >= budget {
					t.Fatalf("a chunk of %d rows and %d bytes went on past the budget %d before its last row", len(c.Rows), size, budget)
				}
				maxRows = max(maxRows, len(c.Rows))
				if c.Final {
					break
				}
				after = c.Last
			}
			if next != 3001 {
				t.Fatalf("read %d rows, want 3000", next-1)
			}
			if maxRows != 1000 {
				t.Fatalf("the largest chunk of small rows held %d rows; want the chunk size, 1000", maxRows)
			}
		})
	}
}

// TestHealthyThroughAFirstStartBackfill (issue 38): /healthz means stuck,
// never busy. A first start's backfill that makes steady progress for
// longer than http.unhealthy_after keeps the pipeline healthy; the same
// backfill stuck (Kafka holds every produce request) turns it unhealthy
// within about unhealthy_after.
func TestHealthyThroughAFirstStartBackfill(t *testing.T) {
	kafka := testenv.NewFakeKafka(t)
	db := testenv.Require(t, pg).NewDatabase(t)
	testenv.Exec(t, db, pollerSchema, `INSERT INTO event_outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'order', 'agg-' || (i % 10), 'old', '{}' FROM generate_series(1, 2000) i`)
	e := &env{db: db, kafka: kafka, cfg: newEnvConfig(db, kafka)}
	e.cfg.Tables = []*outbox.Source{pollerTable(kafka.Prefix, &outbox.BackfillOptions{ChunkSize: 20})}
	// Progress comes with each produce Kafka answers, 100 ms apart: two
	// seconds is twenty of them, room for a loaded machine.
	e.cfg.UnhealthyAfter = 2 * time.Second
	e.cfg.MaxInFlight = 40 // each chunk waits for the one before: steady, slow progress
	var stuck atomic.Bool
	release := make(chan struct{})
	kafka.Fake.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		kafka.Fake.KeepControl()
		if stuck.Load() {
			kafka.Fake.SleepControl(func() { <-release })
		} else {
			kafka.Fake.SleepControl(func() { time.Sleep(100 * time.Millisecond) }) // slow but steady: the load, not a synchronisation
		}
		return nil, nil, false
	})
	r := e.launch(t, ioDiscard{})
	c := kafka.NewConsumer(t, kafka.AllTopics())
	deadline := time.Now().Add(time.Minute)
	busyFor := time.Now()
	for len(ids(c.Records)) < 1000 {
		if err := r.p.Healthy(); err != nil {
			t.Fatalf("unhealthy %s into a first-start backfill that makes progress: %v", time.Since(busyFor).Round(time.Millisecond), err)
		}
		if time.Now().After(deadline) {
			t.Fatal("the backfill did not get half-way")
		}
		c.Settle(t)
	}
	if d := time.Since(busyFor); d < 2*e.cfg.UnhealthyAfter {
		t.Fatalf("half the backfill took %s, less than twice unhealthy_after: the test proves nothing; slow Kafka down more", d)
	}
	stuck.Store(true)
	defer close(release)
	testenv.Eventually(t, 30*time.Second, "the stuck backfill to be unhealthy", func() bool { return r.p.Healthy() != nil })
	if r.tracker.Load() != nil {
		t.Fatal("the stream started: the backfill was not the step that stuck")
	}
}

// TestInheritingTableIsNoOutbox: a table that inherits from the outbox
// (kid, grandkid from it, a foreign archive) is a table of its own: the
// publication is of the outbox ONLY, the stream takes
// its inserts for no table's, and the first start's backfill reads the
// outbox's own rows, ONLY the table, so the two paths agree. Before, the
// backfill sent the children's rows as events, which the stream never
// did, and a table that joined by ALTER TABLE ... INHERIT after the
// snapshot had rows never in the outbox sent.
func TestInheritingTableIsNoOutbox(t *testing.T) {
	kafka := testenv.NewKafka(t)
	db := testenv.Require(t, pg).NewDatabase(t)
	testenv.Exec(t, db, pollerSchema,
		`CREATE TABLE kid () INHERITS (event_outbox)`,
		`CREATE TABLE grandkid () INHERITS (kid)`,
		// A foreign archive that cannot be scanned (its wrapper has no
		// handler, as a server that is down fails), and cannot be
		// published: the publication takes the outbox ONLY, and the
		// first start's lock too (found by an attack: the connector
		// could not create its publication, then never finished its
		// first start).
		`CREATE FOREIGN DATA WRAPPER unreachable`, `CREATE SERVER archive_server FOREIGN DATA WRAPPER unreachable`,
		`CREATE FOREIGN TABLE archive () INHERITS (event_outbox) SERVER archive_server`,
		`INSERT INTO event_outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', 'agg-1', 'old', '{}')`,
		`INSERT INTO kid (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', 'agg-1', 'kid-old', '{}')`,
		`INSERT INTO grandkid (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', 'agg-1', 'grandkid-old', '{}')`)
	cfg := newEnvConfig(db, kafka)
	cfg.Tables = []*outbox.Source{pollerTable(kafka.Prefix, &outbox.BackfillOptions{})}
	e := &env{db: db, kafka: kafka, cfg: cfg}
	e.start(t)
	c := kafka.NewConsumer(t, kafka.AllTopics())
	c.WaitCount(t, time.Minute, 1)
	// The children's rows first, then the outbox's: once "new" is in,
	// any row of theirs the stream took would be in too.
	testenv.Exec(t, db, `INSERT INTO kid (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', 'agg-1', 'kid-new', '{}')`,
		`INSERT INTO grandkid (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', 'agg-1', 'grandkid-new', '{}')`,
		`INSERT INTO event_outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('order', 'agg-1', 'new', '{}')`)
	c.WaitFor(t, time.Minute, `the event "new"`, func(rs []*kgo.Record) bool {
		for _, r := range rs {
			if testenv.Header(r, route.HeaderEventType) == "new" {
				return true
			}
		}
		return false
	})
	var got []string
	for _, r := range c.Records {
		got = append(got, testenv.Header(r, route.HeaderEventType))
	}
	if fmt.Sprint(got) != "[old new]" {
		t.Errorf("the events are %v, want the outbox's own [old new]", got)
	}
}
