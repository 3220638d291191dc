package pipeline_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/config"
	"github.com/outboxcdc/cdc/internal/park"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// TestParkBehindKeepsAReusedID (rule 32): the parking's first event is parked,
// its row is deleted (retention, the app), and a later, different event of
// the same key is committed with the same id (an id reused: serial restarted,
// table recreated, an app re-emitting). parkBehind's first-event dedupe
// (id+table) dropped it as a "re-sent copy", and the event was in no
// topic; only the stream's copy of a row a backfill read is taken for one.
func TestParkBehindKeepsAReusedID(t *testing.T) {
	d := newDetour(t, config.DeliveryAtLeastOnce)
	r := d.start(t)
	conn := testenv.Connect(t, d.db)
	c := d.consumer(t)
	first := d.emit(t, conn, "K", 1, "", true)
	d.emit(t, conn, "K", 2, "", false)
	d.waitParked(t, c, "K", 2, 2)
	ctx := context.Background()
	if _, err := conn.Exec(ctx, `DELETE FROM outbox WHERE id = $1`, first); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, 'order', 'K', 'E', '{"k":"K","seq":3}'::jsonb)`, first); err != nil {
		t.Fatal(err)
	}
	d.emit(t, conn, "K", 4, "", false)
	d.waitParked(t, c, "K", 4, 3)
	t.Logf("parked topic holds K: %v", d.parkedSeqs(t, c.Records)["K"])
	d.cfg.Kafka.MaxMessageBytes = 1 << 20
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	r = d.start(t)
	used := d.redrive(t, park.Selector{Key: "K"}, false, false)
	if !allDone(used) {
		t.Fatalf("redrive: %+v", used)
	}
	want := []int{1, 2, 3, 4}
	c.WaitFor(t, time.Minute, fmt.Sprintf("K %v on its topic", want), func(recs []*kgo.Record) bool {
		return len(seqs(t, recs, d.topic)["K"]) >= 3
	})
	c.SettleConfirmed(t, time.Minute, d.db, "outbox_cdc")
	got := seqs(t, c.Records, d.topic)["K"]
	parked := d.parkedSeqs(t, c.Records)["K"]
	if !slices.Equal(got, want) {
		t.Fatalf("K on its topic: %v, want %v (parked topic held %v): event 3, a different event with the first's id, lost", got, want, parked)
	}
}
