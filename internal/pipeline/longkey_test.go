package pipeline_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/config"
	"github.com/outboxcdc/cdc/internal/park"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// TestALongKeyParksLikeAnyOther (issue 53's attack; rule 34, a row's
// content must not stop the connector): a parking is known by its key's
// digest when the key is longer than park.MaxKey, so a row whose key is
// long enough to fill the parked keys' share of the checkpoint record (the
// share is 8 KiB here) parks like any other: the connector goes on, the
// key's later events go behind it, and a redrive by the key as the rows
// have it, or by the digest cdc parked shows, sends them in order. Before,
// such a row stopped the connector ("one row"), or made the next invalid
// event of any other key stop it ("two rows").
func TestALongKeyParksLikeAnyOther(t *testing.T) {
	for _, c := range []struct {
		name     string
		byDigest bool
	}{{"one row", false}, {"two rows", true}} {
		t.Run(c.name, func(t *testing.T) {
			d := newDetour(t, config.DeliveryAtLeastOnce) // kafka.max_message_bytes 16384: a share of 8192
			r := d.start(t)
			conn := testenv.Connect(t, d.db)
			cons := d.consumer(t)
			long := "H" + strings.Repeat("h", 9000)
			d.emit(t, conn, long, 1, "", true) // too large: parks its key
			d.emit(t, conn, long, 2, "", false)
			if c.name == "two rows" {
				d.emit(t, conn, "K", 1, "", true) // another key's invalid event
				d.waitParked(t, cons, "K", 1, 1)
			}
			d.emit(t, conn, "L", 1, "", false)
			cons.WaitFor(t, time.Minute, "L's event on its topic", func(recs []*kgo.Record) bool {
				return slices.Contains(seqs(t, recs, d.topic)["L"], 1)
			})
			p := d.waitParked(t, cons, long, 2, 2)
			if p.Key != park.KeyID(long) || !strings.HasPrefix(p.Key, "sha256:") || len(p.Key) > park.MaxKey {
				t.Fatalf("the long key's parking is known by %q, want its digest %q", p.Key, park.KeyID(long))
			}
			d.cfg.Kafka.MaxMessageBytes = 1 << 20 // the cause fixed
			if err := r.stop(t); err != nil {
				t.Fatal(err)
			}
			d.start(t)
			sel := park.Selector{Key: long}
			if c.byDigest {
				sel.Key = p.Key
			}
			if used := d.redrive(t, sel, false, false); !allDone(used) {
				t.Fatalf("redrive of the long key: %+v", used)
			}
			d.emit(t, conn, long, 3, "", false)
			cons.WaitFor(t, time.Minute, "the long key's 3 events on its topic", func(recs []*kgo.Record) bool {
				return len(seqs(t, recs, d.topic)[long]) >= 3
			})
			cons.SettleConfirmed(t, time.Minute, d.db, "outbox_cdc")
			if got := seqs(t, cons.Records, d.topic)[long]; !slices.Equal(got, []int{1, 2, 3}) {
				t.Fatalf("the long key on its topic: %v, want [1 2 3]", got)
			}
			for _, rec := range cons.Records {
				if rec.Topic == d.topic && strings.HasPrefix(string(rec.Key), "H") && string(rec.Key) != long {
					t.Fatalf("a record of the long key keyed %.20q..., not by the key itself", rec.Key)
				}
			}
		})
	}
}
