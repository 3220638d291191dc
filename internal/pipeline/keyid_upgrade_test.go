package pipeline_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/config"
	"github.com/outboxcdc/cdc/internal/park"
	"github.com/outboxcdc/cdc/internal/sink"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// oldKey rewrites the checkpoint's parking of k as a connector from before
// park.KeyID wrote it: known by the key as the rows have it.
func oldKey(t *testing.T, d *detour, k string) {
	rec, _ := loadCheckpoint(t, d.env)
	found := false
	for i := range rec.Parked {
		if rec.Parked[i].Key == park.KeyID(k) {
			rec.Parked[i].Key, found = k, true
		}
	}
	if !found {
		t.Fatalf("no parking of %q in %+v", k, rec.Parked)
	}
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
}

// TestOldCheckpointsDigestShapedKeyStaysHeld (the second attack on issue
// 53; rule 32): a checkpoint from before park.KeyID names a key that reads
// as a digest (an OCI image digest as the aggregate id) as it is; after the
// upgrade the key's next event goes behind its parking (park.Find looks
// such a key up as it is too). Before, it went around the parking to the
// key's topic.
func TestOldCheckpointsDigestShapedKeyStaysHeld(t *testing.T) {
	d := newDetour(t, config.DeliveryAtLeastOnce)
	r := d.start(t)
	conn := testenv.Connect(t, d.db)
	c := d.consumer(t)
	k := "sha256:" + strings.Repeat("0123456789abcdef", 4)
	d.emit(t, conn, k, 1, "", true)
	d.waitParked(t, c, k, 1, 1)
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	oldKey(t, d, k)
	d.start(t)
	d.emit(t, conn, k, 2, "", false)
	d.emit(t, conn, "L", 1, "", false)
	c.WaitFor(t, time.Minute, "L's event", func(recs []*kgo.Record) bool { return len(seqs(t, recs, d.topic)["L"]) == 1 })
	c.SettleConfirmed(t, time.Minute, d.db, "outbox_cdc")
	if on := seqs(t, c.Records, d.topic)[k]; len(on) > 0 {
		t.Fatalf("the parked key's events on its topic: %v while its event 1 is parked; parked topic has %v", on, d.parkedSeqs(t, c.Records)[k])
	}
}

// TestRedriveOfAnOldLongKeyAskedWhileStopped (the second attack on issue
// 53; rule 36): a long key in a checkpoint from before park.KeyID; the
// operator, after the upgrade, asks a redrive while the connector is
// stopped (the remedy of a stop), the checkpoint still the old one, so
// the request names the key as it is. The connector finds the parking by
// the key's KeyID and redrives it. Before, it answered "not parked", done,
// while the key stayed parked.
func TestRedriveOfAnOldLongKeyAskedWhileStopped(t *testing.T) {
	d := newDetour(t, config.DeliveryAtLeastOnce)
	r := d.start(t)
	conn := testenv.Connect(t, d.db)
	c := d.consumer(t)
	long := "H" + strings.Repeat("h", 300)
	d.emit(t, conn, long, 1, "", true)
	d.emit(t, conn, long, 2, "", false)
	d.waitParked(t, c, long, 2, 2)
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	oldKey(t, d, long)
	d.cfg.Kafka.MaxMessageBytes = 1 << 20 // the cause fixed
	p := d.newPipeline(t)
	rd, err := p.Ops().RequestRedrive(context.Background(), park.Selector{Key: long}, false, false)
	if err != nil {
		t.Fatal(err)
	}
	d.start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	used, err := p.Ops().WatchRedrive(ctx, rd)
	if err != nil {
		t.Fatal(err)
	}
	rec, _ := loadCheckpoint(t, d.env)
	if allDone(used) && len(rec.Parked) > 0 {
		t.Fatalf("redrive says done (%+v) while the key stays parked: %+v", used, rec.Parked)
	}
	c.WaitFor(t, time.Minute, "the long key's events", func(recs []*kgo.Record) bool { return len(seqs(t, recs, d.topic)[long]) >= 2 })
	if got := seqs(t, c.Records, d.topic)[long]; !slices.Equal(got, []int{1, 2}) {
		t.Fatalf("long key on topic %v", got)
	}
}
