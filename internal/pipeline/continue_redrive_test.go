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
	// The in-process broker, on a real one too: the first start is
	// interrupted by slowing its produce requests.
	d := newDetourOn(t, config.DeliveryAtLeastOnce, testenv.NewFakeKafka(t))
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
	// The drop made the dead-letter topic, which the consumer's expression
	// finds only at its next metadata refresh: read every topic to its end
	// before counting.
	cons.SettleConfirmed(t, time.Minute, d.db, "outbox_cdc")
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

// TestMaxParkedKeysInTheFirstStartsBackfill (rule 36): the first start's
// backfill meets a third invalid key at max_parked_keys 2, in the chunk
// that parked the other two. The error names two remedies, a redrive
// (which "runs as it starts again") and cdc skip; each is tried from the
// state the stop left. The stop saved nothing of that chunk, so cdc
// parked listed nothing to redrive; now it checkpoints what the chunk
// sent before the event, as the stream does, and the next start reads on
// from that event: the redrive's room takes it, and D arrives once.
func TestMaxParkedKeysInTheFirstStartsBackfill(t *testing.T) {
	for _, run := range []struct{ mode, remedy string }{{config.DeliveryAtLeastOnce, "redrive"}, {config.DeliveryAtLeastOnce, "skip"}, {config.DeliveryExactlyOnce, "redrive"}} {
		remedy := run.remedy
		t.Run(run.mode+"/"+remedy, func(t *testing.T) {
			d := newDetour(t, run.mode)
			d.cfg.MaxParkedKeys = 2
			d.tbl.Backfill = &outbox.BackfillOptions{ChunkSize: 10}
			conn := testenv.Connect(t, d.db)
			d.emit(t, conn, "A", 1, "", true)
			d.emit(t, conn, "B", 1, "", true)
			third := d.emit(t, conn, "C", 1, "", true)
			d.emit(t, conn, "D", 1, "", false)
			r := d.launch(t, ioDiscard{})
			err := waitFatal(t, r)
			var full *relay.FullError
			if !errors.As(err, &full) {
				t.Fatalf("got %v; want the max_parked_keys error", err)
			}
			t.Logf("stopped: %v", err)
			rec, _ := loadCheckpoint(t, d.env)
			t.Logf("checkpoint at the stop: parked %d, jobs %+v", len(rec.Parked), rec.Backfills)
			c := d.consumer(t)
			switch remedy {
			case "redrive":
				if len(rec.Parked) != 2 {
					t.Fatalf("the checkpoint lists %d parked keys at the stop, want A and B: cdc parked must show what to redrive", len(rec.Parked))
				}
				p := d.newPipeline(t)
				rd, err := p.Ops().RequestRedrive(context.Background(), park.Selector{Key: "A"}, true, false)
				if err != nil {
					t.Fatal(err)
				}
				r := d.launch(t, ioDiscard{})
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				used, err := p.Ops().WatchRedrive(ctx, rd)
				if err != nil || !allDone(used) {
					select {
					case ferr := <-r.done:
						close(r.done)
						t.Fatalf("the redrive made while the connector was stopped never ran (%+v, %v): the next start stopped again before it: %v", used, err, ferr)
					default:
					}
					t.Fatalf("a redrive made while the connector was stopped: %+v, %v", used, err)
				}
			case "skip":
				if full.Cause.EventID != third {
					t.Fatalf("stopped on %s, want C's event %s", full.Cause.EventID, third)
				}
				if _, err := d.newPipeline(t).Ops().Skip(context.Background(), full.Cause.CommitLSN, third); err != nil {
					t.Fatalf("cdc skip of the event it stopped on (lsn %s): %v", full.Cause.CommitLSN, err)
				}
				r := d.launch(t, ioDiscard{})
				ok := false
				testenv.Eventually(t, time.Minute, "the connector to stream, or stop again", func() bool {
					select {
					case ferr := <-r.done:
						close(r.done)
						t.Fatalf("after cdc skip the next start stopped again: %v", ferr)
					default:
					}
					ok = r.tracker.Load() != nil
					return ok
				})
			}
			c.WaitFor(t, time.Minute, "D on its topic", func(recs []*kgo.Record) bool { return len(seqs(t, recs, d.topic)["D"]) >= 1 })
			c.SettleConfirmed(t, time.Minute, d.db, "outbox_cdc")
			if got := seqs(t, c.Records, d.topic)["D"]; !slices.Equal(got, []int{1}) {
				t.Fatalf("D on its topic: %v; want its event once", got)
			}
			var keys []string
			rec, _ = loadCheckpoint(t, d.env)
			for _, p := range rec.Parked {
				keys = append(keys, p.Key)
			}
			slices.Sort(keys)
			want := map[string][]string{"redrive": {"B", "C"}, "skip": {"A", "B"}}[remedy]
			if !slices.Equal(keys, want) {
				t.Fatalf("parked after the remedy: %v, want %v", keys, want)
			}
		})
	}
}
