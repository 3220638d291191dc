package pipeline_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/config"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/park"
	"github.com/outboxcdc/cdc/internal/replay"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// TestRewindKeepsABackfilledParking (issue 53; rule 32): a key parked by
// the first start's backfill (its first event too large) holds events no
// stream carries: they were committed before the slot. A rewind to the
// parking's first_lsn (the slot's consistent point, where the replay
// window starts too) gave the parking up, and those events were in no
// topic. Now the rewind keeps the backfilled records parked and gives up
// only the one the stream sends again, which parks behind them; the
// redrive sends all four in order, each once. With the parked records
// gone, the rewind refuses, naming the key and the redrive, and leaves
// the checkpoint as it was.
func TestRewindKeepsABackfilledParking(t *testing.T) {
	for _, loss := range []string{"none", "parked records deleted"} {
		t.Run(loss, func(t *testing.T) {
			d := newDetour(t, config.DeliveryAtLeastOnce)
			d.cfg.Replay.Window = time.Hour
			d.tbl.Backfill = &outbox.BackfillOptions{ChunkSize: 10}
			conn := testenv.Connect(t, d.db)
			d.emit(t, conn, "K", 1, "", true) // too large: parks K in the backfill
			d.emit(t, conn, "K", 2, "", false)
			d.emit(t, conn, "K", 3, "", false)
			r := d.start(t)
			c := d.consumer(t)
			d.waitParked(t, c, "K", 3, 3)
			d.emit(t, conn, "K", 4, "", false) // by the stream
			p := d.waitParked(t, c, "K", 4, 4)
			if err := r.stop(t); err != nil {
				t.Fatal(err)
			}
			if !p.Read {
				t.Fatalf("parking %+v: want it marked as holding rows read from the table", p)
			}
			if loss != "none" {
				var end int64 = -1
				for _, rec := range c.Records {
					if rec.Topic == d.parked {
						end = max(end, rec.Offset)
					}
				}
				o := kadm.Offsets{}
				o.Add(kadm.Offset{Topic: d.parked, Partition: p.Partition, At: end + 1})
				if resp, err := kadm.NewClient(d.kafka.Client(t)).DeleteRecords(context.Background(), o); err != nil || resp.Error() != nil {
					t.Fatalf("delete records: %v %v", err, resp.Error())
				}
				_, err := d.newPipeline(t).Ops().Rewind(context.Background(), replay.Range{FromLSN: p.FirstLSN})
				if err == nil || !strings.Contains(err.Error(), `key "K"`) || !strings.Contains(err.Error(), "cdc redrive --key 'K'") || strings.Contains(err.Error(), "\n") {
					t.Fatalf("rewind to the start of a backfilled parking whose records are gone: %v; want a one-line refusal naming the key and the redrive", err)
				}
				if rec, _ := loadCheckpoint(t, d.env); len(rec.Parked) != 1 || rec.Parked[0].Events != 4 {
					t.Fatalf("after the refused rewind, parked: %+v; want K's parking as it was", rec.Parked)
				}
				return
			}
			if _, err := d.newPipeline(t).Ops().Rewind(context.Background(), replay.Range{FromLSN: p.FirstLSN}); err != nil {
				t.Fatal(err)
			}
			rec, _ := loadCheckpoint(t, d.env)
			if len(rec.Parked) != 1 || rec.Parked[0].Key != "K" || rec.Parked[0].Events != 3 {
				t.Fatalf("parked after the rewind: %+v; want K's 3 backfilled events kept", rec.Parked)
			}
			r = d.start(t)
			d.waitParked(t, c, "K", 4, 4)
			if err := r.stop(t); err != nil {
				t.Fatal(err)
			}
			d.cfg.Kafka.MaxMessageBytes = 1 << 20
			d.start(t)
			if used := d.redrive(t, park.Selector{Key: "K"}, false, false); !allDone(used) {
				t.Fatalf("redrive: %+v", used)
			}
			c.WaitFor(t, time.Minute, "K's 4 events on its topic", func(recs []*kgo.Record) bool { return len(seqs(t, recs, d.topic)["K"]) >= 4 })
			c.SettleConfirmed(t, time.Minute, d.db, "outbox_cdc")
			if k := seqs(t, c.Records, d.topic)["K"]; !slices.Equal(k, []int{1, 2, 3, 4}) {
				t.Fatalf("K on its topic: %v; want 1 to 4, each once, in order", k)
			}
		})
	}
}
