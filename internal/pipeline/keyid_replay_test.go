package pipeline_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/config"
	"github.com/outboxcdc/cdc/internal/replay"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// TestReplayHoldsALongParkedKey (the second attack on issue 53; rule 32):
// TestReplayHoldsAParkedKey with a key known by its digest (longer than
// park.MaxKey, or one that begins as a digest does): a replay holds back
// its later events behind the parked first one. Before, replay.Filter.Held
// looked the record key up as it is, the checkpoint naming the digest, and
// the replay sent event 2 while event 1 was parked.
func TestReplayHoldsALongParkedKey(t *testing.T) {
	for _, k := range []string{"H" + strings.Repeat("h", 300), "sha256:abc"} {
		t.Run(k[:5], func(t *testing.T) {
			d := newDetour(t, config.DeliveryAtLeastOnce)
			d.cfg.Replay.Window = time.Hour
			d.start(t)
			conn := testenv.Connect(t, d.db)
			c := d.consumer(t)
			d.emit(t, conn, k, 1, "", true)
			from := testenv.CurrentWAL(t, d.db)
			d.emit(t, conn, k, 2, "", false)
			d.emit(t, conn, "L", 1, "", false)
			d.waitParked(t, c, k, 2, 2)
			c.WaitFor(t, time.Minute, "L's events", func(recs []*kgo.Record) bool { return len(seqs(t, recs, d.topic)["L"]) == 1 })
			sum, err := d.newPipeline(t).Replay(context.Background(), replay.Request{Range: replay.Range{FromLSN: from}}, nil)
			if err != nil {
				t.Fatalf("replay: %v", err)
			}
			c.WaitFor(t, time.Minute, "L's events replayed", func(recs []*kgo.Record) bool { return len(seqs(t, recs, d.topic)["L"]) == 2 })
			c.Settle(t)
			if on := seqs(t, c.Records, d.topic); len(on[k]) > 0 || sum.Held != 1 {
				t.Fatalf("after the replay: parked key on its topic %v (event 1 is still parked), held %d, sent %d; want none on the topic, 1 held", on[k], sum.Held, sum.Events)
			}
			_ = slices.Equal[[]int]
		})
	}
}
