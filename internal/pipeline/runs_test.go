package pipeline_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/config"
	"github.com/outboxcdc/cdc/internal/ops"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/park"
	"github.com/outboxcdc/cdc/internal/sink"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// TestParkedKeyOutgrowingItsShareHasARemedy (the attack on issue 53; rules
// 5 and 36): each session that parks an event of a parked key adds a run
// to the key's entry in the checkpoint (so that a redrive tells its
// records from copies a crashed session left), and a key parked across
// many sessions fills the parked keys' share of the checkpoint record: the
// connector stops on its next event, naming the key. The remedy the error
// names works from there: a redrive of the key asked while the connector
// is stopped (--drop-first, its first event being invalid still) runs as
// it starts again, and every later event of the key reaches its topic in
// order, the one it stopped on included. cdc skip, which would let one
// event by out of its key's order and stop again at the next, is not
// offered.
func TestParkedKeyOutgrowingItsShareHasARemedy(t *testing.T) {
	d := newDetour(t, config.DeliveryAtLeastOnce)
	d.cfg.Kafka.MaxMessageBytes = 8192 // a share of 4096 bytes: some 60 sessions' runs
	conn := testenv.Connect(t, d.db)
	r := d.start(t)
	c := d.consumer(t)
	d.emit(t, conn, "K", 1, "", true)
	d.waitParked(t, c, "K", 1, 1)
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	var stop error
	last := 1
	for i := 2; stop == nil; i++ {
		if i > 400 {
			t.Fatal("400 sessions each parked an event of K, and the checkpoint's share never filled")
		}
		r = d.start(t)
		d.emit(t, conn, "K", i, "", false)
		last = i
		testenv.Eventually(t, 30*time.Second, "K's next event parked, or the connector stopped", func() bool {
			select {
			case err := <-r.done:
				close(r.done)
				stop = err
				return true
			default:
			}
			rec, _ := loadCheckpoint(t, d.env)
			return len(rec.Parked) == 1 && rec.Parked[0].Events >= int64(i)
		})
		if stop == nil {
			if err := r.stop(t); err != nil {
				t.Fatal(err)
			}
		}
	}
	var ee *outbox.EventError
	if !errors.As(stop, &ee) || !strings.Contains(stop.Error(), `its key "K" is parked`) || !strings.Contains(stop.Error(), "cdc redrive --key 'K'") || strings.Contains(stop.Error(), "cdc skip") {
		t.Fatalf("stop after %d sessions: %v; want the key named, a redrive of it offered, not cdc skip", last, stop)
	}
	// The remedy: a redrive asked while the connector is stopped.
	p := d.newPipeline(t)
	req, err := p.Ops().RequestRedrive(context.Background(), park.Selector{Key: "K"}, true, false)
	if err != nil {
		t.Fatal(err)
	}
	r = d.start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	used, err := p.Ops().WatchRedrive(ctx, req)
	if err != nil || !allDone(used) {
		t.Fatalf("the redrive the error offered: %+v, %v", used, err)
	}
	d.emit(t, conn, "K", last+1, "", false)
	var want []int
	for s := 2; s <= last+1; s++ {
		want = append(want, s)
	}
	c.WaitFor(t, time.Minute, "K's events after its first on its topic", func(recs []*kgo.Record) bool {
		return len(seqs(t, recs, d.topic)["K"]) >= len(want)
	})
	c.SettleConfirmed(t, time.Minute, d.db, "outbox_cdc")
	if got := seqs(t, c.Records, d.topic)["K"]; !slices.Equal(got, want) {
		t.Fatalf("K on its topic: %v, want %v", got, want)
	}
	if dead := seqs(t, c.Records, d.dead)["K"]; !slices.Equal(dead, []int{1}) {
		t.Fatalf("K dead-lettered: %v, want its first only (--drop-first)", dead)
	}
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
}

// TestDropFirstAfterARedriveStoppedPartWay (the attack on issue 53, rule
// 36): a redrive that stopped part-way (sent records 1 and 2, then met
// record 3 invalid) leaves Released at 2, and the next redrive starts at
// record 3, whose invalid-still outcome names --drop-first. That remedy
// acts on the first record not sent yet, so it works from that state:
// record 3 goes to the dead-letter topic and the rest on, in order. Before,
// --drop-first acted on record 1 only, which the redrive no longer reads,
// and the key stayed parked. The state is written into the checkpoint as
// such a redrive leaves it.
func TestDropFirstAfterARedriveStoppedPartWay(t *testing.T) {
	d := newDetour(t, config.DeliveryAtLeastOnce)
	r := d.start(t)
	conn := testenv.Connect(t, d.db)
	c := d.consumer(t)
	for s := 1; s <= 5; s++ {
		d.emit(t, conn, "K", s, "", s == 1 || s == 3)
	}
	d.waitParked(t, c, "K", 5, 5)
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	rec, _ := loadCheckpoint(t, d.env)
	rec.Parked[0].Released = 2
	rec.Seq++
	ctx := context.Background()
	store, err := checkpoint.OpenStore(ctx, d.cfg.Checkpoint.Topic, sink.ClientOpts(sink.Config{Brokers: d.kafka.Brokers}, hclog.NewNullLogger()), hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	store.SignWith(d.cfg.Checkpoint.SigningKeys)
	if err := store.Save(ctx, rec); err != nil {
		t.Fatal(err)
	}
	d.start(t)
	used := d.redrive(t, park.Selector{Key: "K"}, false, false)
	// The outcome the checkpoint keeps is cut (the log has it whole): its
	// offer of --drop-first begins "send the first to the dead-letter topic".
	if allDone(used) || !strings.Contains(used[0].Outcome, "event 3 of 5") || !strings.Contains(used[0].Outcome, "send the first to the dead-letter topic") {
		t.Fatalf("redrive from record 3: %+v; want record 3 named invalid still, --drop-first offered", used)
	}
	if used := d.redrive(t, park.Selector{Key: "K"}, true, false); !allDone(used) {
		t.Fatalf("redrive --drop-first from record 3: %+v", used)
	}
	c.WaitFor(t, time.Minute, "K's 4 and 5 on its topic", func(recs []*kgo.Record) bool {
		return len(seqs(t, recs, d.topic)["K"]) >= 2
	})
	c.SettleConfirmed(t, time.Minute, d.db, "outbox_cdc")
	if got := seqs(t, c.Records, d.topic)["K"]; !slices.Equal(got, []int{4, 5}) {
		t.Fatalf("K on its topic: %v, want [4 5]", got)
	}
	if dead := seqs(t, c.Records, d.dead)["K"]; !slices.Equal(dead, []int{3}) {
		t.Fatalf("K dead-lettered: %v, want [3], the first not sent", dead)
	}
}

// TestRedriveWithTheLedgerFullSaysSo (remedies that end, rule 36): the
// connector remembers every request it took for a while, within a share
// of the checkpoint record (an eighth of the limit: 2 KiB here), and
// refuses one past it, so that none runs twice. cdc redrive sees that room
// full in the checkpoint and says so at once, with what to do, instead of
// announcing a request the connector refuses and waiting out its age (10
// minutes) for nothing.
func TestRedriveWithTheLedgerFullSaysSo(t *testing.T) {
	d := newDetour(t, config.DeliveryAtLeastOnce)
	d.start(t)
	conn := testenv.Connect(t, d.db)
	c := d.consumer(t)
	d.emit(t, conn, "K", 1, "", true)
	d.waitParked(t, c, "K", 1, 1)
	p := d.newPipeline(t)
	for n := 1; ; n++ {
		req, err := p.Ops().Redrive(context.Background(), park.Selector{Key: "K"}, ops.RedriveOptions{})
		if err != nil {
			if !strings.Contains(err.Error(), "run the command again in a few minutes") {
				t.Fatalf("redrive %d: %v; want the room for requests named full", n, err)
			}
			t.Logf("redrive %d refused at once: %v", n, err)
			break
		}
		if n > 50 {
			t.Fatal("50 redrives taken within minutes, and the room for them never filled")
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		used, err := p.Ops().WatchRedrive(ctx, req)
		cancel()
		// An outcome is cut as the room fills; the connector's log has it.
		if err != nil || allDone(used) || !strings.Contains(used[0].Outcome, "stays parked") && !strings.Contains(used[0].Outcome, "cut to fit") {
			t.Fatalf("redrive %d of a key invalid still: %+v, %v; want it taken, the key parked", n, used, err)
		}
	}
}
