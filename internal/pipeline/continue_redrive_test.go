package pipeline_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxcdc/cdc/internal/config"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/park"
	"github.com/outboxcdc/cdc/internal/relay"
	"github.com/outboxcdc/cdc/internal/route"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// TestRedriveBeforeTheContinuedBackfill (rule 36, a remedy from the state
// that prints it): the first start's backfill parks A and B, saves them,
// and stops at max_parked_keys on C. The error says to redrive, which the
// connector takes as it starts again; the next start continued the
// backfill first, met C again and stopped, so the redrive never ran.
// Pending redrives now run before what the backfill left.
func TestRedriveBeforeTheContinuedBackfill(t *testing.T) {
	// The in-process broker, on a real one too: its produce requests are
	// slowed.
	d := newDetourOn(t, config.DeliveryAtLeastOnce, testenv.NewFakeKafka(t))
	d.cfg.MaxParkedKeys = 2
	d.cfg.MaxInFlight = 20
	d.tbl.Backfill = &outbox.BackfillOptions{ChunkSize: 10}
	conn := testenv.Connect(t, d.db)
	d.emit(t, conn, "A", 1, "", true)
	d.emit(t, conn, "B", 1, "", true)
	testenv.Exec(t, d.db, `INSERT INTO outbox (aggregatetype, aggregateid, type, payload) SELECT 'order', 'D', 'E', jsonb_build_object('k', 'D', 'seq', i) FROM generate_series(1, 300) i`)
	d.emit(t, conn, "C", 1, "", true)
	// Slow enough for the job to save its progress, A and B parked with
	// it, before it reaches C.
	d.kafka.Fake.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		d.kafka.Fake.KeepControl()
		d.kafka.Fake.SleepControl(func() { time.Sleep(20 * time.Millisecond) })
		return nil, nil, false
	})
	r := d.launch(t, ioDiscard{})
	var full *relay.FullError
	if err := waitFatal(t, r); !errors.As(err, &full) {
		t.Fatalf("got %v; want the max_parked_keys error", err)
	}
	if rec, _ := loadCheckpoint(t, d.env); len(rec.Parked) != 2 {
		t.Fatalf("the checkpoint lists %d parked keys at the stop; want A and B (job %+v)", len(rec.Parked), rec.Backfills)
	}
	p := d.newPipeline(t)
	rd, err := p.Ops().RequestRedrive(context.Background(), park.Selector{Key: "A"}, true, false)
	if err != nil {
		t.Fatal(err)
	}
	r = d.launch(t, ioDiscard{})
	defer r.stop(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	used, err := p.Ops().WatchRedrive(ctx, rd)
	if err != nil || !allDone(used) {
		t.Fatalf("the redrive asked while the connector was stopped: %+v, %v; want it run as the connector starts", used, err)
	}
}

// TestDropFirstAfterContinue (rule 36): an event committed after the slot
// while the first start is interrupted is sent twice, by the continued
// job (its snapshot of now shows it) and by the stream. When it is
// invalid, its key's parking held it twice, so --drop-first, the
// runbook's remedy for "the first event invalid still", dropped one copy
// and the other kept the key parked. The parking's first event is parked
// once, and the remedy works: the key's next event reaches its topic.
func TestDropFirstAfterContinue(t *testing.T) {
	d := newDetour(t, config.DeliveryAtLeastOnce)
	testenv.Exec(t, d.db, `INSERT INTO outbox (aggregatetype, aggregateid, type, payload) SELECT 'order', 'agg', 'E', jsonb_build_object('k', 'agg-' || (i % 5), 'seq', i) FROM generate_series(1, 300) i`)
	c := orderCase{rng: rand.New(rand.NewPCG(1, 2)), aggs: 5, rows: 60}
	fast := c.interruptFirstStart(t, d.env, d.kafka, outbox.BackfillOptions{})
	conn := testenv.Connect(t, d.db)
	first := d.emit(t, conn, "K", 1, "", true)
	fast()
	d.start(t)
	cons := d.consumer(t)
	d.waitParked(t, cons, "K", 1, 1)
	testenv.Eventually(t, time.Minute, "the job to end", func() bool {
		rec, _ := loadCheckpoint(t, d.env)
		return len(rec.Backfills) > 0 && rec.Backfills[0].Done()
	})
	// The stream's copy is past the job's end; wait until the slot is past
	// K's event too, so that a second copy would be parked by now.
	d.emit(t, conn, "L", 1, "", false)
	cons.WaitFor(t, time.Minute, "L's event, after K's in the stream", func(recs []*kgo.Record) bool { return len(seqs(t, recs, d.topic)["L"]) >= 1 })
	cons.SettleConfirmed(t, time.Minute, d.db, "outbox_cdc")
	if got := d.parkedSeqs(t, cons.Records)["K"]; !slices.Equal(got, []int{1}) {
		t.Fatalf("K's parked records: %v; want its one event once", got)
	}
	used := d.redrive(t, park.Selector{Key: "K"}, true, false)
	if !allDone(used) {
		t.Fatalf("redrive --drop-first of K: %+v", used)
	}
	d.emit(t, conn, "K", 2, "", false)
	cons.WaitFor(t, time.Minute, "K's next event on its topic", func(recs []*kgo.Record) bool { return len(seqs(t, recs, d.topic)["K"]) >= 1 })
	if k := seqs(t, cons.Records, d.topic)["K"]; !slices.Equal(k, []int{2}) {
		t.Fatalf("K on its topic: %v; want only 2 (1 was dropped)", k)
	}
	dropped := 0
	for _, r := range cons.Records {
		if r.Topic == d.dead && testenv.Header(r, route.HeaderDeadLetterID) == first {
			dropped++
		}
	}
	if dropped != 1 {
		t.Fatalf("K's first event in the dead-letter topic %d times, want once", dropped)
	}
}
