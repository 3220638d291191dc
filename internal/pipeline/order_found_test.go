package pipeline_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxcdc/cdc/internal/config"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// TestRepairSendsTheEventOfADeletedRow (found by the attack on the commit
// order; loss): a repair whose stream waits at the new relation's first
// event for its snapshot passes over only the events whose rows the
// snapshot sent. An event inserted and deleted in one transaction (the
// documented pattern: its INSERT is in the WAL, and it is delivered), by a
// transaction the snapshot shows, is in no snapshot: the stream sends it,
// in both modes. It passed over every event of such a transaction.
func TestRepairSendsTheEventOfADeletedRow(t *testing.T) {
	for _, mode := range []string{config.DeliveryAtLeastOnce, config.DeliveryExactlyOnce} {
		t.Run(mode, func(t *testing.T) { repairPassesOverDeletedRowsEvent(t, mode) })
	}
}

func repairPassesOverDeletedRowsEvent(t *testing.T, mode string) {
	e := newEnv(t, testenv.NewKafka(t))
	e.cfg.Delivery = mode
	e.cfg.Postgres.CatalogCheckInterval = 5 * time.Minute // the watch looks at start, and when asked
	r := e.start(t)
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	testenv.Exec(t, e.db, recreateSQL)
	ctx := context.Background()
	conn := testenv.Connect(t, e.db)
	want := map[string]bool{}
	before := insertSeq(t, conn, "agg", 0) // before the start: the snapshot's
	want[before] = true
	open, err := testenv.Connect(t, e.db).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Rollback(ctx)
	var openID string
	if err := open.QueryRow(ctx, `INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('order', 'open', 'Seq', $1) RETURNING id::text`, seqPayload("open", 0)).Scan(&openID); err != nil {
		t.Fatal(err)
	}
	want[openID] = true
	r = e.start(t)
	testenv.Eventually(t, 30*time.Second, "the new table published", func() bool {
		var n int
		testenv.QueryRow(t, e.db, `SELECT count(*) FROM pg_publication_tables WHERE pubname = 'outbox_cdc' AND tablename = 'outbox'`, nil, &n)
		return n == 1
	})
	// Inserted and deleted in one transaction, after the table joined the
	// publication: the event is the WAL's alone.
	var gone string
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('order', 'agg', 'Seq', $1) RETURNING id::text`, seqPayload("agg", 1)).Scan(&gone); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `DELETE FROM outbox WHERE id = $1`, gone)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	want[gone] = true
	c := e.kafka.NewConsumer(t, e.kafka.AllTopics())
	if mode == config.DeliveryExactlyOnce {
		c = e.kafka.NewCommittedConsumer(t, e.kafka.AllTopics())
	}
	// No wait is needed here: the repair's snapshot waits for open, which
	// began before the table joined the publication, so it is taken after
	// gone's transaction committed whenever open commits, and shows it.
	if err := open.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	later := insertSeq(t, conn, "agg", 2)
	want[later] = true
	c.WaitFor(t, time.Minute, "the event after the repair", func(recs []*kgo.Record) bool { return ids(recs)[later] > 0 })
	c.Settle(t)
	got := ids(c.Records)
	for id := range want {
		if got[id] == 0 {
			what := "an event"
			if id == gone {
				what = "the event inserted and deleted in one transaction after the table was published"
			}
			t.Errorf("%s (%s) is in no topic", what, id)
		}
	}
}

// TestSwapWhileAFirstStartIsUnfinished (found by the attack; loss): a
// first start's backfill interrupted half-way, then the outbox swapped
// while the connector is stopped (renamed away, another created under the
// name): the job reads on the relation it began on, under its new name,
// and every row committed before the slot reaches a topic. It read the
// new table by the name, ended done, and 240 of 400 rows were in none.
func TestSwapWhileAFirstStartIsUnfinished(t *testing.T) {
	kafka := testenv.NewFakeKafka(t)
	e := newEnv(t, kafka)
	testenv.Exec(t, e.db, `INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
		SELECT 'order', 'agg-' || (i % 10), 'Seq', jsonb_build_object('agg', 'agg-' || (i % 10), 'seq', i) FROM generate_series(1, 400) i`)
	var old []string
	testenv.QueryRow(t, e.db, `SELECT array_agg(id::text) FROM outbox`, nil, &old)
	e.cfg.Tables[0].Backfill = &outbox.BackfillOptions{ChunkSize: 20}
	e.cfg.MaxInFlight = 40
	var slow atomic.Bool
	slow.Store(true)
	kafka.Fake.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		kafka.Fake.KeepControl()
		if slow.Load() {
			kafka.Fake.SleepControl(func() { time.Sleep(50 * time.Millisecond) })
		}
		return nil, nil, false
	})
	r := e.launch(t, ioDiscard{})
	testenv.Eventually(t, time.Minute, "the first start's job to save progress half-way", func() bool {
		rec, ok := loadCheckpoint(t, e)
		if !ok || len(rec.Backfills) != 1 {
			return false
		}
		j := rec.Backfills[0]
		return j.Rows >= 100 && !j.Done()
	})
	r.stop(t)
	rec, _ := loadCheckpoint(t, e)
	if rec.Backfills[0].Done() {
		t.Fatal("the job finished before the stop: the test proves nothing")
	}
	t.Logf("stopped with job %+v", rec.Backfills[0])
	testenv.Exec(t, e.db, `BEGIN; ALTER TABLE outbox RENAME TO outbox_old; CREATE TABLE outbox (LIKE outbox_old INCLUDING ALL); COMMIT;`)
	conn := testenv.Connect(t, e.db)
	newer := insertSeq(t, conn, "agg-0", 1000)
	slow.Store(false)
	e.start(t)
	testenv.Eventually(t, time.Minute, "the job to end", func() bool {
		rec, ok := loadCheckpoint(t, e)
		return ok && len(rec.Backfills) == 1 && rec.Backfills[0].Done()
	})
	c := kafka.NewConsumer(t, kafka.AllTopics())
	c.WaitFor(t, time.Minute, "the new table's event", func(recs []*kgo.Record) bool { return ids(recs)[newer] > 0 })
	c.Settle(t)
	got := ids(c.Records)
	lost := 0
	for _, id := range old {
		if got[id] == 0 {
			lost++
		}
	}
	if lost > 0 {
		rec, _ := loadCheckpoint(t, e)
		t.Errorf("%d of the %d rows committed before the slot are in no topic; the job says %+v", lost, len(old), rec.Backfills[0])
	}
}
