package pipeline_test

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

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
	c := drawOrderCase(t, seed)
	kafka := testenv.NewFakeKafka(t)
	e := newEnv(t, kafka)
	want := c.writeBefore(t, e)
	e.cfg.Tables[0].Backfill = &outbox.BackfillOptions{ChunkSize: 10}
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
	c.writeAfter(t, e, want)
	slow.Store(false)
	e.start(t)
	expectFirstArrivalsInOrder(t, kafka.NewConsumer(t, kafka.AllTopics()), want)
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
	expectFirstArrivalsInOrder(t, kafka.NewConsumer(t, kafka.AllTopics()), want)
}

// expectFirstArrivalsInOrder waits until every id in want arrived, then
// checks that, within each aggregate, the first arrivals of its events
// are in the order of their sequence numbers (its commit order), and that
// nothing else arrived. Later arrivals of an event are duplicates.
func expectFirstArrivalsInOrder(t *testing.T, c *testenv.Consumer, want map[string]bool) {
	t.Helper()
	c.WaitFor(t, 2*time.Minute, fmt.Sprintf("%d events", len(want)), func(recs []*kgo.Record) bool {
		got := ids(recs)
		for id := range want {
			if got[id] == 0 {
				return false
			}
		}
		return true
	})
	seen := map[string]bool{}
	last := map[string]int{}
	reordered := 0
	for _, rec := range c.Records {
		id := testenv.Header(rec, route.HeaderID)
		if !want[id] {
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
