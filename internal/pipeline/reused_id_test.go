package pipeline_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
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

// TestRepairRowReusesTheFirstsID (rule 32, found by the attack on issue
// 53): K is parked by its streamed event 1; the table is dropped and
// created again, and filled before the connector publishes it, with K's
// event 2 and then event 3 under event 1's id (ids restart with a table).
// The repair parks 2, so the parking holds a row read from the table, and
// 3, a read row with the first's id, was taken for the first event met
// again and dropped: K read 1, 2, 4. A copy is the first's only with its
// content (checkpoint.Parked.FirstSum).
func TestRepairRowReusesTheFirstsID(t *testing.T) {
	d := newDetour(t, config.DeliveryAtLeastOnce)
	r := d.start(t)
	conn := testenv.Connect(t, d.db)
	c := d.consumer(t)
	first := d.emit(t, conn, "K", 1, "", true) // too large: parks K
	d.waitParked(t, c, "K", 1, 1)
	create := strings.TrimSuffix(strings.TrimPrefix(recreateSQL, "BEGIN;\nDROP TABLE outbox;\n"), "\nCOMMIT;")
	testenv.Exec(t, d.db, "BEGIN; DROP TABLE outbox; "+create+
		` INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('order', 'K', 'E', '{"k": "K", "seq": 2}');`+
		` INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ('`+first+`', 'order', 'K', 'E', '{"k": "K", "seq": 3}');`+
		" COMMIT;")
	testenv.Eventually(t, time.Minute, "the recreated table repaired", func() bool {
		return testenv.Counter(t, r.p.Metrics().Registry, "cdc_table_repairs_total", "table", "public.outbox") >= 1
	})
	d.emit(t, conn, "K", 4, "", false)
	d.waitParked(t, c, "K", 4, 3)
	if got := d.parkedSeqs(t, c.Records)["K"]; !slices.Equal(got, []int{1, 2, 3, 4}) {
		t.Fatalf("parked topic holds K %v; want 1 to 4 (3, a row of the recreated table under event 1's id, dropped as the first's copy?)", got)
	}
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	d.cfg.Kafka.MaxMessageBytes = 1 << 20
	d.start(t)
	if used := d.redrive(t, park.Selector{Key: "K"}, false, false); !allDone(used) {
		t.Fatalf("redrive: %+v", used)
	}
	c.WaitFor(t, time.Minute, "K's event 4 on its topic", func(recs []*kgo.Record) bool { return slices.Contains(seqs(t, recs, d.topic)["K"], 4) })
	c.SettleConfirmed(t, time.Minute, d.db, "outbox_cdc")
	if got := seqs(t, c.Records, d.topic)["K"]; !slices.Equal(got, []int{1, 2, 3, 4}) {
		t.Fatalf("K on its topic: %v; want 1 to 4", got)
	}
}
