package pipeline_test

import (
	"testing"
	"time"

	"github.com/outboxcdc/cdc/internal/config"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/park"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// TestRetentionKeepsParkedRows (issue 53): while a key is parked, retention
// deletes no row of any table, its events' rows included (they are what a
// parking that lost records is recovered from); once it is redriven,
// retention deletes again.
func TestRetentionKeepsParkedRows(t *testing.T) {
	d := newDetour(t, config.DeliveryAtLeastOnce)
	d.tbl.Retention = &outbox.Retention{After: time.Second}
	d.retentionInterval = 200 * time.Millisecond
	r := d.start(t)
	conn := testenv.Connect(t, d.db)
	c := d.consumer(t)
	d.emit(t, conn, "L", 1, "", false)
	d.emit(t, conn, "K", 1, "", true)
	d.emit(t, conn, "K", 2, "", false)
	d.waitParked(t, c, "K", 2, 2)
	rows := func() int {
		var n int
		testenv.QueryRow(t, d.db, `SELECT count(*) FROM outbox`, nil, &n)
		return n
	}
	// Sweeps that began well past retention.after of every row.
	past := time.Now().Add(2 * time.Second)
	testenv.Eventually(t, time.Minute, "a sweep past retention.after", func() bool {
		return testenv.Counter(t, r.p.Metrics().Registry, "cdc_retention_last_run_timestamp_seconds", "table", "public.outbox") > float64(past.Unix())
	})
	if n := rows(); n != 3 {
		t.Fatalf("%d of 3 rows left while K is parked; retention must keep them all", n)
	}
	if used := d.redrive(t, park.Selector{Key: "K"}, true, false); !allDone(used) {
		t.Fatalf("redrive: %+v", used)
	}
	testenv.Eventually(t, time.Minute, "retention to delete the rows once K is redriven", func() bool { return rows() == 0 })
}
