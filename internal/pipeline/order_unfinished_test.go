package pipeline_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxcdc/cdc/internal/config"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/route"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// TestUnfinishedBackfillKeepsOrder (rule 32, "An aggregate keeps its order
// on every path"): what the configuration's backfill has left when the
// stream would start goes before the stream, so that no aggregate's event
// committed after the slot's point reaches its topic before that
// aggregate's older rows. Beside the stream, it did: an interrupted first
// start, and a slot adopted without a checkpoint, sent the newer events at
// once and the older rows as the job's chunks came.
//
// A generator of such cases: each run draws the aggregates, their rows
// before the slot, where the first start is interrupted and which
// aggregates get events after it (the seed is in the log). The check is on
// each event's first arrival: the rows committed since the slot's point
// come twice (the job reads a snapshot of now, and the stream sends them
// again), which is allowed; an aggregate whose newer event arrives first
// is not.
func TestUnfinishedBackfillKeepsOrder(t *testing.T) {
	t.Run("interrupted first start", func(t *testing.T) {
		for round := range 2 {
			seed := uint64(time.Now().UnixNano()) + uint64(round)
			t.Run(fmt.Sprint(round), func(t *testing.T) { interruptedFirstStartKeepsOrder(t, seed) })
		}
	})
	t.Run("adopted slot", func(t *testing.T) {
		seed := uint64(time.Now().UnixNano())
		adoptedSlotKeepsOrder(t, seed)
	})
	// A statement timeout while a migration holds the table's lock is no
	// reason to run the job beside the stream: the lock goes, and the
	// job's older rows came after the newer events (35-38 of them).
	// Both in each delivery mode: a job ended before the stream saves its
	// end in exactly-once mode's transaction too.
	for _, mode := range []string{config.DeliveryAtLeastOnce, config.DeliveryExactlyOnce} {
		t.Run("interrupted first start behind a lock/"+mode, func(t *testing.T) {
			seed := uint64(time.Now().UnixNano())
			lockedFirstStartKeepsOrder(t, seed, mode)
		})
		// A condition the server refuses (it names a column dropped
		// since) stops the connector, saying what to fix; fixed, every
		// row arrives, in order. Ended, its rows not sent were lost.
		t.Run("interrupted first start refused/"+mode, func(t *testing.T) {
			seed := uint64(time.Now().UnixNano())
			refusedFirstStartWaits(t, seed, mode)
		})
	}
}

// consumer reads e's topics as mode's consumers do.
func consumer(t *testing.T, e *env, mode string) *testenv.Consumer {
	if mode == config.DeliveryExactlyOnce {
		return e.kafka.NewCommittedConsumer(t, e.kafka.AllTopics())
	}
	return e.kafka.NewConsumer(t, e.kafka.AllTopics())
}

// orderCase is one drawn case: aggs aggregates with rows[a] rows each
// before the slot, interleaved in one transaction in the order of their
// sequence numbers.
type orderCase struct {
	rng  *rand.Rand
	aggs int
	rows int // per aggregate
}

func drawOrderCase(t *testing.T, seed uint64) orderCase {
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 56))
	return orderCase{rng: rng, aggs: 3 + rng.IntN(10), rows: 20 + rng.IntN(40)}
}

// writeBefore inserts the case's rows in one transaction and returns
// their ids.
func (c orderCase) writeBefore(t *testing.T, e *env) map[string]bool {
	testenv.Exec(t, e.db, fmt.Sprintf(`INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
		SELECT 'order', 'agg-' || (i %% %[1]d), 'Seq', jsonb_build_object('agg', 'agg-' || (i %% %[1]d), 'seq', i / %[1]d)
		FROM generate_series(0, %[2]d) i`, c.aggs, c.aggs*c.rows-1))
	var all []string
	testenv.QueryRow(t, e.db, `SELECT array_agg(id::text) FROM outbox`, nil, &all)
	want := map[string]bool{}
	for _, id := range all {
		want[id] = true
	}
	return want
}

// writeAfter inserts, one transaction each, newer events for a random
// half or more of the aggregates (the last aggregate always, whose rows a
// job reads last), and adds them to want.
func (c orderCase) writeAfter(t *testing.T, e *env, want map[string]bool) {
	conn := testenv.Connect(t, e.db)
	n := 0
	for a := range c.aggs {
		if a != c.aggs-1 && c.rng.IntN(2) == 0 {
			continue
		}
		for k := range 1 + c.rng.IntN(3) {
			want[insertSeq(t, conn, fmt.Sprintf("agg-%d", a), 1000+k)] = true
			n++
		}
	}
	t.Logf("%d aggregates of %d rows before the slot, %d events after", c.aggs, c.rows, n)
}

func interruptedFirstStartKeepsOrder(t *testing.T, seed uint64) {
	e, kafka, want := interruptedCase(t, seed, config.DeliveryAtLeastOnce)
	e.start(t)
	expectFirstArrivalsInOrder(t, kafka.NewConsumer(t, kafka.AllTopics()), want, want)
}

// interruptedCase draws a case, interrupts its first start, and writes
// its events after the slot; want has every id written.
func interruptedCase(t *testing.T, seed uint64, mode string) (*env, *testenv.Kafka, map[string]bool) {
	c := drawOrderCase(t, seed)
	kafka := testenv.NewFakeKafka(t)
	e := newEnv(t, kafka)
	e.cfg.Delivery = mode
	want := c.writeBefore(t, e)
	fast := c.interruptFirstStart(t, e, kafka, outbox.BackfillOptions{})
	c.writeAfter(t, e, want)
	fast()
	return e, kafka, want
}

// interruptFirstStart starts the case's first start, slowed by Kafka,
// and stops it once its job saved some of its rows.
func (c orderCase) interruptFirstStart(t *testing.T, e *env, kafka *testenv.Kafka, opts outbox.BackfillOptions) (fast func()) {
	opts.ChunkSize = 10
	e.cfg.Tables[0].Backfill = &opts
	e.cfg.MaxInFlight = 20
	var slow atomic.Bool
	slow.Store(true)
	kafka.Fake.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		kafka.Fake.KeepControl()
		if slow.Load() {
			kafka.Fake.SleepControl(func() { time.Sleep(100 * time.Millisecond) })
		}
		return nil, nil, false
	})
	total := c.aggs * c.rows
	stopAt := 10 + c.rng.IntN(total/2)
	r := e.launch(t, ioDiscard{})
	testenv.Eventually(t, time.Minute, fmt.Sprintf("the first start's job to save %d rows", stopAt), func() bool {
		rec, ok := loadCheckpoint(t, e)
		return ok && len(rec.Backfills) == 1 && rec.Backfills[0].Rows >= int64(stopAt)
	})
	r.stop(t)
	if rec, _ := loadCheckpoint(t, e); rec.Backfills[0].Done() {
		t.Skipf("the job finished before the stop (%d rows): this case proves nothing", rec.Backfills[0].Rows)
	}
	return func() { slow.Store(false) }
}

// lockedFirstStartKeepsOrder: the next start finds the table locked by a
// migration's transaction for longer than backfill.statement_timeout; the
// job's statements time out until it commits. The stream must wait.
func lockedFirstStartKeepsOrder(t *testing.T, seed uint64, mode string) {
	e, _, want := interruptedCase(t, seed, mode)
	ctx := context.Background()
	lock, err := testenv.Connect(t, e.db).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lock.Exec(ctx, `LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	var logs testenv.Buffer
	e.cfg.Backfill.StatementTimeout = time.Second
	e.logLevel = hclog.Info
	r := e.launch(t, &logs)
	defer r.stop(t)
	testenv.Eventually(t, time.Minute, "a backfill statement to time out behind the lock", func() bool {
		return strings.Contains(logs.String(), "statement timeout")
	})
	if err := lock.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	expectFirstArrivalsInOrder(t, consumer(t, e, mode), want, want)
}

func refusedFirstStartWaits(t *testing.T, seed uint64, mode string) {
	c := drawOrderCase(t, seed)
	kafka := testenv.NewFakeKafka(t)
	e := newEnv(t, kafka)
	e.cfg.Delivery = mode
	testenv.Exec(t, e.db, `ALTER TABLE outbox ADD COLUMN tenant text NOT NULL DEFAULT 'a'`)
	want := c.writeBefore(t, e)
	fast := c.interruptFirstStart(t, e, kafka, outbox.BackfillOptions{Where: "tenant = 'a'"})
	testenv.Exec(t, e.db, `ALTER TABLE outbox DROP COLUMN tenant`)
	c.writeAfter(t, e, want)
	fast()
	r := e.launch(t, ioDiscard{})
	select {
	case err := <-r.done:
		close(r.done)
		if err == nil || !strings.Contains(err.Error(), `column "tenant" does not exist`) || !strings.Contains(err.Error(), "tables[].backfill.where") {
			t.Fatalf("the connector stopped with %v; want the dropped column and the key to fix named", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the connector did not stop on a condition the server refuses")
	}
	if rec, _ := loadCheckpoint(t, e); rec.Backfills[0].Done() {
		t.Fatalf("the job was ended: %+v", rec.Backfills[0])
	}
	// The remedy the error names: the condition fixed in the configuration.
	e.cfg.Tables[0].Backfill.Where = ""
	e.start(t)
	expectFirstArrivalsInOrder(t, consumer(t, e, mode), want, want)
}

// TestContinuedBackfillThroughChanges: what an operator or a migration
// may change while a first start is interrupted, each drawn as a case of
// its own (rows, aggregates, the interruption point): the job continues
// before the stream, in the order its saved position is in, on the
// relation it began on, with the configuration's condition, and every row
// arrives, first arrivals in each aggregate's order. Before, each of these
// ended the job or skipped its rest without a word (an order_by changed
// read the saved key as another column's; set on a job in commit order,
// or removed, it could not resume; an edited condition dropped the job as
// forged; a rename failed its check of the table under its old name).
func TestContinuedBackfillThroughChanges(t *testing.T) {
	for _, tc := range []struct {
		name   string
		schema string
		opts   outbox.BackfillOptions
		change func(t *testing.T, e *env)
	}{
		{"order_by changed", `ALTER TABLE outbox ADD COLUMN n bigserial NOT NULL, ADD COLUMN m bigint NOT NULL DEFAULT 0`,
			outbox.BackfillOptions{OrderBy: []string{"n"}},
			func(t *testing.T, e *env) { e.cfg.Tables[0].Backfill.OrderBy = []string{"m"} }},
		{"order_by removed", `ALTER TABLE outbox ADD COLUMN n bigserial NOT NULL`,
			outbox.BackfillOptions{OrderBy: []string{"n"}},
			func(t *testing.T, e *env) { e.cfg.Tables[0].Backfill.OrderBy = nil }},
		{"order_by set on a job in commit order", "", outbox.BackfillOptions{},
			func(t *testing.T, e *env) { e.cfg.Tables[0].Backfill.OrderBy = []string{"id"} }},
		{"where edited", "", outbox.BackfillOptions{Where: "aggregatetype = 'order'"},
			func(t *testing.T, e *env) { e.cfg.Tables[0].Backfill.Where = "aggregatetype <> 'none'" }},
		{"table renamed", "", outbox.BackfillOptions{},
			func(t *testing.T, e *env) { testenv.Exec(t, e.db, `ALTER TABLE outbox RENAME TO outbox_renamed`) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := drawOrderCase(t, uint64(time.Now().UnixNano()))
			kafka := testenv.NewFakeKafka(t)
			e := newEnv(t, kafka)
			if tc.schema != "" {
				testenv.Exec(t, e.db, tc.schema)
			}
			want := c.writeBefore(t, e)
			fast := c.interruptFirstStart(t, e, kafka, tc.opts)
			c.writeAfter(t, e, want)
			fast()
			tc.change(t, e)
			e.start(t)
			expectFirstArrivalsInOrder(t, kafka.NewConsumer(t, kafka.AllTopics()), want, want)
			if rec, _ := loadCheckpoint(t, e); !rec.Backfills[0].Done() || rec.Backfills[0].Error != "" {
				t.Errorf("the job: %+v; want it finished", rec.Backfills[0])
			}
		})
	}
}

func adoptedSlotKeepsOrder(t *testing.T, seed uint64) {
	c := drawOrderCase(t, seed)
	kafka := testenv.NewFakeKafka(t)
	e := newEnv(t, kafka)
	want := c.writeBefore(t, e)
	testenv.Exec(t, e.db, `CREATE PUBLICATION outbox_cdc FOR TABLE outbox WITH (publish = 'insert')`,
		`SELECT pg_create_logical_replication_slot('outbox_cdc', 'pgoutput')`)
	c.writeAfter(t, e, want)
	e.cfg.Tables[0].Backfill = &outbox.BackfillOptions{ChunkSize: 10}
	e.cfg.MaxInFlight = 20
	e.start(t)
	expectFirstArrivalsInOrder(t, kafka.NewConsumer(t, kafka.AllTopics()), want, want)
}

// expectFirstArrivalsInOrder waits until every id in want arrived, then
// checks that, within each aggregate, the first arrivals of its events
// are in the order of their sequence numbers (its commit order), and that
// nothing outside allowed arrived. Later arrivals of an event are
// duplicates.
func expectFirstArrivalsInOrder(t *testing.T, c *testenv.Consumer, want, allowed map[string]bool) {
	t.Helper()
	waitForIDs(t, c, want)
	seen := map[string]bool{}
	last := map[string]int{}
	reordered := 0
	for _, rec := range c.Records {
		id := testenv.Header(rec, route.HeaderID)
		if !allowed[id] {
			t.Errorf("record %s that the test did not write", id)
			continue
		}
		if seen[id] {
			continue
		}
		seen[id] = true
		var ev seqEvent
		if err := json.Unmarshal(rec.Value, &ev); err != nil {
			t.Fatalf("record %s: %v", id, err)
		}
		if string(rec.Key) != ev.Agg {
			t.Errorf("record %s: key %q, want %q", id, rec.Key, ev.Agg)
		}
		if prev, ok := last[ev.Agg]; ok && ev.Seq <= prev {
			if reordered++; reordered <= 5 {
				t.Errorf("%s: seq %d arrived first after seq %d", ev.Agg, ev.Seq, prev)
			}
		}
		last[ev.Agg] = max(last[ev.Agg], ev.Seq)
	}
	if reordered > 0 {
		t.Errorf("%d events arrived first after a newer one of their aggregate", reordered)
	}
}
