package pipeline_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/config"
	"github.com/outboxcdc/cdc/internal/ops"
	"github.com/outboxcdc/cdc/internal/park"
	"github.com/outboxcdc/cdc/internal/route"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// TestDropInvalidOfARecordParkedValid (found by the attack on issue 53):
// K parks on event 1; event 2, valid then, parks behind it as the record
// it would have been; the limit is lowered, so event 2 no longer fits. The
// redrive's outcome names --drop-invalid, which dropped only events parked
// invalid: the key stayed parked for good. Now event 2's record goes to
// the dead-letter topic with its reason and the topic it was meant for,
// and 3 goes on.
func TestDropInvalidOfARecordParkedValid(t *testing.T) {
	d := newDetour(t, config.DeliveryAtLeastOnce)
	r := d.start(t)
	conn := testenv.Connect(t, d.db)
	c := d.consumer(t)
	d.emit(t, conn, "K", 1, "", true)                                                   // 20 kB: too large, parks K
	second := d.emit(t, conn, "K", 2, `"mid": "`+strings.Repeat("y", 10000)+`"`, false) // 10 kB: fits 16 kB
	d.emit(t, conn, "K", 3, "", false)
	d.waitParked(t, c, "K", 3, 3)
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	d.cfg.Kafka.MaxMessageBytes = 8192 // event 2 no longer fits its topic
	r = d.start(t)
	defer r.stop(t)
	p := d.newPipeline(t)
	rd, err := p.Ops().Redrive(context.Background(), park.Selector{Key: "K"}, ops.RedriveOptions{DropInvalid: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if used, err := p.Ops().WatchRedrive(ctx, rd); err != nil || !allDone(used) {
		t.Fatalf("--drop-invalid with a record parked valid, invalid now: %+v, %v; want 1 and 2 dead-lettered, 3 sent on", used, err)
	}
	c.WaitFor(t, time.Minute, "K's 3 on its topic and 1, 2 dead-lettered", func(recs []*kgo.Record) bool {
		return len(seqs(t, recs, d.topic)["K"]) >= 1 && len(seqs(t, recs, d.dead)["K"]) >= 2
	})
	c.SettleConfirmed(t, time.Minute, d.db, "outbox_cdc")
	if on, dead := seqs(t, c.Records, d.topic)["K"], seqs(t, c.Records, d.dead)["K"]; !slices.Equal(on, []int{3}) || !slices.Equal(dead, []int{1, 2}) {
		t.Fatalf("K on its topic %v, dead-lettered %v; want 3, and 1, 2", on, dead)
	}
	for _, rec := range c.Records {
		if rec.Topic == d.dead && testenv.Header(rec, route.HeaderDeadLetterID) == second {
			if testenv.Header(rec, route.HeaderDeadLetterTopic) != d.topic || !strings.Contains(testenv.Header(rec, route.HeaderDeadLetterError), "--drop-invalid") {
				t.Fatalf("event 2's dead letter: topic %q, error %q; want %s and the reason", testenv.Header(rec, route.HeaderDeadLetterTopic), testenv.Header(rec, route.HeaderDeadLetterError), d.topic)
			}
		}
	}
}
