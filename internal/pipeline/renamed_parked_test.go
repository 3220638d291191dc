package pipeline_test

import (
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/config"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/park"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// TestRedriveAfterARename (found by the attack on issue 53): K parked on
// outbox, the table renamed as docs/operations.md says (ALTER TABLE
// RENAME, then tables[].name), twice. The parked records name the table
// as it was, and the redrive stopped the connector ("configure the table
// again"), whose remedy sent every row again. The checkpoint keeps the
// names the table had; the redrive finds it by them, and K's events go
// on in order, the connector running.
func TestRedriveAfterARename(t *testing.T) {
	d := newDetour(t, config.DeliveryAtLeastOnce)
	r := d.start(t)
	conn := testenv.Connect(t, d.db)
	c := d.consumer(t)
	d.emit(t, conn, "K", 1, "", true)
	d.emit(t, conn, "K", 2, "", false)
	d.waitParked(t, c, "K", 2, 2)
	for i, name := range []string{"outbox_v2", "outbox_v3"} {
		if err := r.stop(t); err != nil {
			t.Fatal(err)
		}
		testenv.Exec(t, d.db, `ALTER TABLE `+d.tbl.Name.Name+` RENAME TO `+name)
		d.tbl.Name = outbox.TableName{Schema: "public", Name: name}
		r = d.start(t)
		testenv.Exec(t, d.db, `INSERT INTO `+name+` (aggregatetype, aggregateid, type, payload) VALUES ('order', 'K', 'E', jsonb_build_object('k', 'K', 'seq', `+[]string{"3", "4"}[i]+`))`)
		d.waitParked(t, c, "K", 3+i, 3+i)
	}
	d.cfg.Kafka.MaxMessageBytes = 1 << 20 // the cause fixed
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	r = d.start(t)
	defer r.stop(t)
	if used := d.redrive(t, park.Selector{Key: "K"}, false, false); !allDone(used) {
		t.Fatalf("redrive after the renames: %+v", used)
	}
	c.WaitFor(t, time.Minute, "K's 4 events on its topic", func(recs []*kgo.Record) bool { return len(seqs(t, recs, d.topic)["K"]) >= 4 })
	c.SettleConfirmed(t, time.Minute, d.db, "outbox_cdc")
	if got := seqs(t, c.Records, d.topic)["K"]; !slices.Equal(got, []int{1, 2, 3, 4}) {
		t.Fatalf("K on its topic %v, want 1 to 4 once each in order", got)
	}
	// Running still: an event after the redrive arrives, after K's four.
	testenv.Exec(t, d.db, `INSERT INTO outbox_v3 (aggregatetype, aggregateid, type, payload) VALUES ('order', 'K', 'E', '{"k": "K", "seq": 5}')`)
	c.WaitFor(t, time.Minute, "K's event 5 after the redrive", func(recs []*kgo.Record) bool { return len(seqs(t, recs, d.topic)["K"]) >= 5 })
	if got := seqs(t, c.Records, d.topic)["K"]; !slices.Equal(got, []int{1, 2, 3, 4, 5}) {
		t.Fatalf("K on its topic %v, want 1 to 5 in order", got)
	}
}
