package pipeline_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxcdc/cdc/internal/config"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/park"
	"github.com/outboxcdc/cdc/internal/relay"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// TestRedriveBeforeTheContinuedBackfill (rule 36, a remedy from the state
// that prints it): the first start's backfill parks A and B, saves them,
// and stops at max_parked_keys on C. The error says to redrive, which the
// connector takes as it starts again; the next start continued the
// backfill first, met C again and stopped, so the redrive never ran.
// Pending redrives now run before what the backfill left.
func TestRedriveBeforeTheContinuedBackfill(t *testing.T) {
	// The in-process broker, on a real one too: its produce requests are
	// slowed.
	d := newDetourOn(t, config.DeliveryAtLeastOnce, testenv.NewFakeKafka(t))
	d.cfg.MaxParkedKeys = 2
	d.cfg.MaxInFlight = 20
	d.tbl.Backfill = &outbox.BackfillOptions{ChunkSize: 10}
	conn := testenv.Connect(t, d.db)
	d.emit(t, conn, "A", 1, "", true)
	d.emit(t, conn, "B", 1, "", true)
	testenv.Exec(t, d.db, `INSERT INTO outbox (aggregatetype, aggregateid, type, payload) SELECT 'order', 'D', 'E', jsonb_build_object('k', 'D', 'seq', i) FROM generate_series(1, 300) i`)
	d.emit(t, conn, "C", 1, "", true)
	// Slow enough for the job to save its progress, A and B parked with
	// it, before it reaches C.
	d.kafka.Fake.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		d.kafka.Fake.KeepControl()
		d.kafka.Fake.SleepControl(func() { time.Sleep(20 * time.Millisecond) })
		return nil, nil, false
	})
	r := d.launch(t, ioDiscard{})
	var full *relay.FullError
	if err := waitFatal(t, r); !errors.As(err, &full) {
		t.Fatalf("got %v; want the max_parked_keys error", err)
	}
	if rec, _ := loadCheckpoint(t, d.env); len(rec.Parked) != 2 {
		t.Fatalf("the checkpoint lists %d parked keys at the stop; want A and B (job %+v)", len(rec.Parked), rec.Backfills)
	}
	p := d.newPipeline(t)
	rd, err := p.Ops().RequestRedrive(context.Background(), park.Selector{Key: "A"}, true, false)
	if err != nil {
		t.Fatal(err)
	}
	r = d.launch(t, ioDiscard{})
	defer r.stop(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	used, err := p.Ops().WatchRedrive(ctx, rd)
	if err != nil || !allDone(used) {
		t.Fatalf("the redrive asked while the connector was stopped: %+v, %v; want it run as the connector starts", used, err)
	}
}
