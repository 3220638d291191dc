package pipeline_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/config"
	"github.com/outboxcdc/cdc/internal/replay"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// TestReplayHoldsAParkedKey (found by the attack on issue 53): key K
// parks on its event 1 (too large), its events 2 and 3 behind it. A
// replay of a range that begins after event 1 re-sent 2 and 3 to K's
// topic while 1 was still parked: a later event of the key before an
// earlier one. It holds them back now, as the parking does (a redrive
// sends them on), and says so; key L's events in the range are re-sent.
// A replay to topics of its own (a suffix) holds nothing back.
func TestReplayHoldsAParkedKey(t *testing.T) {
	d := newDetour(t, config.DeliveryAtLeastOnce)
	d.cfg.Replay.Window = time.Hour
	d.start(t)
	conn := testenv.Connect(t, d.db)
	c := d.consumer(t)
	d.emit(t, conn, "K", 1, "", true)
	from := testenv.CurrentWAL(t, d.db)
	d.emit(t, conn, "K", 2, "", false)
	d.emit(t, conn, "L", 1, "", false)
	d.emit(t, conn, "K", 3, "", false)
	d.emit(t, conn, "L", 2, "", false)
	d.waitParked(t, c, "K", 3, 3)
	c.WaitFor(t, time.Minute, "L's events", func(recs []*kgo.Record) bool { return len(seqs(t, recs, d.topic)["L"]) == 2 })
	sum, err := d.newPipeline(t).Replay(context.Background(), replay.Request{Range: replay.Range{FromLSN: from}}, nil)
	if err != nil {
		t.Fatalf("replay: %v", err)
	}
	if sum.Events != 2 || sum.Held != 2 {
		t.Fatalf("replay: %d events sent, %d held back; want L's 2 sent and K's 2 held back (K is parked)", sum.Events, sum.Held)
	}
	c.WaitFor(t, time.Minute, "L's events replayed", func(recs []*kgo.Record) bool { return len(seqs(t, recs, d.topic)["L"]) == 4 })
	c.Settle(t) // the replay returned: what it sent is in Kafka
	if on := seqs(t, c.Records, d.topic); len(on["K"]) > 0 || !slices.Equal(on["L"], []int{1, 2, 1, 2}) {
		t.Fatalf("K's topic after the replay: K %v, L %v; want K none (its event 1 is parked), L 1 2 1 2", on["K"], on["L"])
	}
	sum, err = d.newPipeline(t).Replay(context.Background(), replay.Request{Range: replay.Range{FromLSN: from}, TopicSuffix: ".replay"}, nil)
	if err != nil {
		t.Fatalf("replay to .replay topics: %v", err)
	}
	if sum.Events != 4 || sum.Held != 0 {
		t.Fatalf("replay to .replay topics: %d events sent, %d held back; want all 4, none held", sum.Events, sum.Held)
	}
}
