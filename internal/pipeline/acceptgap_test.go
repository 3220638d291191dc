package pipeline_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/config"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/park"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// TestAcceptGapOfReadRowsWithRetention is the runbook's remedy for a
// parking of rows a backfill read, whose records are gone from the parked
// topic (found by the attack on issue 53: done as the runbook said then,
// --accept-gap and then cdc backfill --where, retention deleted the rows
// between the two, their events in no topic). As docs/operations.md says
// now: retention off for the table first, then --accept-gap, then the
// backfill of the key's rows, which parks the key again on its invalid
// first event; a redrive --drop-first sends the rest, and every row is
// still in the outbox.
func TestAcceptGapOfReadRowsWithRetention(t *testing.T) {
	d, r, c := parkedReadAndGone(t)
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	d.tbl.Retention = nil // the runbook's first step
	d.start(t)
	if used := d.redrive(t, park.Selector{Key: "K"}, false, true); !allDone(used) {
		t.Fatalf("redrive --accept-gap: %+v", used)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin := d.newPipeline(t)
	req, err := admin.Ops().RequestBackfill(ctx, d.tbl, "aggregateid = 'K'")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Ops().WatchBackfill(ctx, req, func(checkpoint.Job) {}); err != nil {
		t.Fatal(err)
	}
	d.waitParked(t, c, "K", 2, 2) // its first event is invalid still
	if used := d.redrive(t, park.Selector{Key: "K"}, true, false); !allDone(used) {
		t.Fatalf("redrive --drop-first: %+v", used)
	}
	c.WaitFor(t, time.Minute, "K's event 2 on its topic", func(recs []*kgo.Record) bool { return slices.Contains(seqs(t, recs, d.topic)["K"], 2) })
	var n int
	testenv.QueryRow(t, d.db, `SELECT count(*) FROM outbox WHERE aggregateid = 'K'`, nil, &n)
	if n != 2 {
		t.Fatalf("%d of K's 2 rows are left in the outbox", n)
	}
}

// TestAcceptGapRefusedUnderRetention (found by the attack on issue 53):
// K's parking of rows a backfill read loses its records; with retention on
// the table, --accept-gap un-parked K and retention then deleted its rows,
// whose events no topic held. It is refused now: K stays parked, the
// outcome says to take retention off first, and K's rows stay through a
// sweep past retention.after.
func TestAcceptGapRefusedUnderRetention(t *testing.T) {
	d, r, _ := parkedReadAndGone(t)
	used := d.redrive(t, park.Selector{Key: "K"}, false, true)
	if allDone(used) || len(used) != 1 || !strings.Contains(used[0].Outcome, "Take tables[].retention off") {
		t.Fatalf("redrive --accept-gap under retention: %+v; want it refused, saying to take retention off first", used)
	}
	past := time.Now().Add(2 * time.Second)
	testenv.Eventually(t, time.Minute, "a sweep past retention.after", func() bool {
		return testenv.Counter(t, r.p.Metrics().Registry, "cdc_retention_last_run_timestamp_seconds", "table", "public.outbox") > float64(past.Unix())
	})
	var n int
	testenv.QueryRow(t, d.db, `SELECT count(*) FROM outbox WHERE aggregateid = 'K'`, nil, &n)
	if n != 2 {
		t.Fatalf("%d of K's 2 rows left after the refused --accept-gap", n)
	}
	if rec, _ := loadCheckpoint(t, d.env); len(rec.Parked) != 1 || rec.Parked[0].Key != "K" {
		t.Fatalf("parked after the refused --accept-gap: %+v; want K", rec.Parked)
	}
}

// parkedReadAndGone is a running connector whose first start's backfill
// parked key K (its event 1 too large, 2 behind it) on a table with
// retention, and the parked topic with K's records deleted.
func parkedReadAndGone(t *testing.T) (*detour, *running, *testenv.Consumer) {
	t.Helper()
	d := newDetour(t, config.DeliveryAtLeastOnce)
	d.tbl.Retention = &outbox.Retention{After: time.Second}
	d.tbl.Backfill = &outbox.BackfillOptions{ChunkSize: 10}
	d.retentionInterval = 200 * time.Millisecond
	conn := testenv.Connect(t, d.db)
	d.emit(t, conn, "K", 1, "", true)
	d.emit(t, conn, "K", 2, "", false)
	r := d.start(t)
	c := d.consumer(t)
	p := d.waitParked(t, c, "K", 2, 2)
	if !p.Read {
		t.Fatalf("K's parking %+v: want rows read by the backfill", p)
	}
	adm := kadm.NewClient(d.kafka.Client(t))
	o := kadm.Offsets{}
	o.Add(kadm.Offset{Topic: d.parked, Partition: p.Partition, At: -1})
	if resp, err := adm.DeleteRecords(context.Background(), o); err != nil || resp.Error() != nil {
		t.Fatalf("delete records: %v %v", err, resp.Error())
	}
	return d, r, c
}

// TestAcceptGapOfAnotherTablesEvents (found by the attack on issue 53): K
// is parked by an event of outbox, which has no retention, and its next
// event, of outbox2, which has, parks behind it; the parked records are
// deleted. --accept-gap was refused only where the parking's first table
// had retention, so it un-parked K, and retention deleted K's row of
// outbox2, whose event no topic held. A record gone names no table: the
// redrive refuses while any table has retention, and the row stays
// through a sweep past retention.after.
func TestAcceptGapOfAnotherTablesEvents(t *testing.T) {
	d := newDetour(t, config.DeliveryAtLeastOnce)
	d.retentionInterval = 200 * time.Millisecond
	testenv.Exec(t, d.db, `CREATE TABLE outbox2 (LIKE outbox INCLUDING ALL)`)
	tb := *d.tbl
	tb.Name = outbox.TableName{Schema: "public", Name: "outbox2"}
	tb.Retention = &outbox.Retention{After: time.Second}
	d.cfg.Tables = append(d.cfg.Tables, &tb)
	r := d.start(t)
	conn := testenv.Connect(t, d.db)
	c := d.consumer(t)
	d.emit(t, conn, "K", 1, "", true) // too large: parks K
	testenv.Exec(t, d.db, `INSERT INTO outbox2 (aggregatetype, aggregateid, type, payload) VALUES ('order', 'K', 'E', '{"k": "K", "seq": 2}')`)
	p := d.waitParked(t, c, "K", 2, 2)
	adm := kadm.NewClient(d.kafka.Client(t))
	o := kadm.Offsets{}
	o.Add(kadm.Offset{Topic: d.parked, Partition: p.Partition, At: -1})
	if resp, err := adm.DeleteRecords(context.Background(), o); err != nil || resp.Error() != nil {
		t.Fatalf("delete records: %v %v", err, resp.Error())
	}
	used := d.redrive(t, park.Selector{Key: "K"}, false, true)
	if allDone(used) || len(used) != 1 || !strings.Contains(used[0].Outcome, "public.outbox2 has retention") {
		t.Fatalf("redrive --accept-gap with retention on outbox2: %+v; want it refused, naming outbox2", used)
	}
	past := time.Now().Add(2 * time.Second)
	testenv.Eventually(t, time.Minute, "a sweep of outbox2 past retention.after", func() bool {
		return testenv.Counter(t, r.p.Metrics().Registry, "cdc_retention_last_run_timestamp_seconds", "table", "public.outbox2") > float64(past.Unix())
	})
	var n int
	testenv.QueryRow(t, d.db, `SELECT count(*) FROM outbox2 WHERE aggregateid = 'K'`, nil, &n)
	if n != 1 {
		t.Fatalf("%d of K's 1 row of outbox2 left after the refused --accept-gap", n)
	}
	if rec, _ := loadCheckpoint(t, d.env); len(rec.Parked) != 1 || rec.Parked[0].Key != "K" {
		t.Fatalf("parked after the refused --accept-gap: %+v; want K", rec.Parked)
	}
}
