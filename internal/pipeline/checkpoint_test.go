package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/fault"
	"github.com/outboxcdc/cdc/internal/route"
	"github.com/outboxcdc/cdc/internal/sink"
	"github.com/outboxcdc/cdc/internal/testenv"
	"github.com/outboxcdc/cdc/internal/wal"
)

// systemID is the server's database system identifier.
func systemID(t *testing.T, db string) string {
	t.Helper()
	var id string
	testenv.QueryRow(t, db, `SELECT system_identifier::text FROM pg_control_system()`, nil, &id)
	return id
}

// loadCheckpoint reads the pipeline's checkpoint record from Kafka.
func loadCheckpoint(t *testing.T, e *env) (checkpoint.Record, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := checkpoint.OpenStore(ctx, e.cfg.Checkpoint.Topic, sink.ClientOpts(sink.Config{Brokers: e.kafka.Brokers}, hclog.NewNullLogger()), hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	recs, err := s.Load(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	r, ok := recs[checkpoint.Key("outbox_cdc", systemID(t, e.db))]
	return r, ok
}

// TestCheckpointLeadsTheSlot: every confirm is covered by a checkpoint
// written first, and the checkpoint names the last delivered commit.
func TestCheckpointLeadsTheSlot(t *testing.T) {
	e := newEnv(t, testenv.NewKafka(t))
	r := e.start(t)
	conn := testenv.Connect(t, e.db)
	var last string
	for i := 0; i < 20; i++ {
		last = insertEvent(t, conn, fmt.Sprintf("c-%d", i%3), "E")
	}
	c := e.kafka.NewConsumer(t, e.kafka.AllTopics())
	c.WaitFor(t, time.Minute, "the last event", func(recs []*kgo.Record) bool { return ids(recs)[last] > 0 })
	// The last event written commits last. The last record read need not
	// be its: a consumer reads the partitions in no order among them.
	lastCommit := commitOf(c.Records, last)
	testenv.Eventually(t, 30*time.Second, "the slot to confirm the last transaction", func() bool {
		return testenv.SlotPosition(t, e.db, "outbox_cdc") > lastCommit
	})
	for i := 0; i < 5; i++ { // the slot keeps moving with keepalives
		slot := testenv.SlotPosition(t, e.db, "outbox_cdc")
		rec, ok := loadCheckpoint(t, e)
		if !ok || rec.Confirmed < slot {
			t.Fatalf("checkpoint %+v (found %v) is behind the slot at %s", rec, ok, slot)
		}
	}
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	rec, _ := loadCheckpoint(t, e)
	if rec.CommitLSN != lastCommit || rec.CommitTime.IsZero() || rec.SystemID != systemID(t, e.db) || rec.Slot != "outbox_cdc" || rec.Timeline != 1 {
		t.Fatalf("checkpoint after a clean stop = %+v; want commit %s", rec, lastCommit)
	}
	if slot := testenv.SlotPosition(t, e.db, "outbox_cdc"); rec.Confirmed < slot {
		t.Fatalf("checkpoint %s behind the slot %s after a clean stop", rec.Confirmed, slot)
	}
}

// wantGap starts the pipeline and wants it refused with a gap of kind.
func wantGap(t *testing.T, e *env, kind checkpoint.GapKind, mentions ...string) *checkpoint.GapError {
	t.Helper()
	err := waitFatal(t, e.launch(t, os.Stderr))
	var gap *checkpoint.GapError
	if !errors.As(err, &gap) || gap.Kind != kind || !fault.Permanent(err) {
		t.Fatalf("Run returned %v; want a permanent gap of kind %d", err, kind)
	}
	for _, m := range append(mentions, "cdc reset --config", "--accept-gap") {
		if !strings.Contains(err.Error(), m) {
			t.Errorf("the gap error does not mention %q: %v", m, err)
		}
	}
	if strings.Contains(err.Error(), "\n") {
		t.Errorf("the gap error is not one line: %q", err)
	}
	return gap
}

// TestSlotDroppedWhileStoppedIsRefused: stop, drop the slot (a DBA's
// clean-up), write 200 events, start: refused, and no new slot is created.
func TestSlotDroppedWhileStoppedIsRefused(t *testing.T) {
	e := newEnv(t, testenv.NewKafka(t))
	r := e.start(t)
	insertEvent(t, testenv.Connect(t, e.db), "d-1", "Before")
	c := e.kafka.NewConsumer(t, e.kafka.AllTopics())
	c.WaitCount(t, time.Minute, 1)
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	rec, _ := loadCheckpoint(t, e)
	testenv.Exec(t, e.db, `SELECT pg_drop_replication_slot('outbox_cdc')`)
	conn := testenv.Connect(t, e.db)
	for i := 0; i < 200; i++ {
		insertEvent(t, conn, "d-1", "WhileStopped")
	}
	wantGap(t, e, checkpoint.GapSlotMissing, `replication slot "outbox_cdc" is missing`, rec.Confirmed.String())
	if testenv.SlotPosition(t, e.db, "outbox_cdc") != 0 {
		t.Fatal("a new slot was created over the gap")
	}

	// cdc reset --accept-gap records the gap, and the connector streams
	// on from a new slot.
	a, err := e.newPipeline(t).Ops().AcceptGap(context.Background())
	if err != nil || a.Gap == nil || a.From != rec.Confirmed || a.To == 0 {
		t.Fatalf("AcceptGap = %+v, %v", a, err)
	}
	after, _ := loadCheckpoint(t, e)
	if h := after.History; len(h) != 1 || h[0].Kind != checkpoint.JumpAcceptedGap || h[0].From != rec.Confirmed || h[0].To != a.To || after.Confirmed != a.To {
		t.Fatalf("checkpoint after accepting the gap: %+v", after)
	}
	if again, err := e.newPipeline(t).Ops().AcceptGap(context.Background()); err != nil || again.Gap != nil {
		t.Fatalf("a second reset: %+v, %v; want nothing to accept", again, err)
	}
	e.start(t)
	next := insertEvent(t, conn, "d-1", "AfterReset")
	c.WaitFor(t, time.Minute, "the event written after the reset", func(recs []*kgo.Record) bool { return ids(recs)[next] > 0 })
	for _, r := range c.Records {
		if testenv.Header(r, route.HeaderEventType) == "WhileStopped" {
			t.Fatal("an event of the accepted gap was delivered: the slot should have started after it")
		}
	}
}

// TestSlotMovedWhileStoppedIsRefused: someone advances the slot past the
// checkpoint while the connector is stopped.
func TestSlotMovedWhileStoppedIsRefused(t *testing.T) {
	e := newEnv(t, testenv.NewKafka(t))
	r := e.start(t)
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	rec, _ := loadCheckpoint(t, e)
	insertEvent(t, testenv.Connect(t, e.db), "m-1", "Skipped")
	testenv.Exec(t, e.db, `SELECT pg_switch_wal()`)
	end := testenv.CurrentWAL(t, e.db)
	testenv.Eventually(t, 30*time.Second, "the slot to be advanced past the event", func() bool {
		testenv.Exec(t, e.db, fmt.Sprintf(`SELECT pg_replication_slot_advance('outbox_cdc', '%s')`, end))
		return testenv.SlotPosition(t, e.db, "outbox_cdc") > rec.Confirmed
	})
	wantGap(t, e, checkpoint.GapSlotAhead, "past the checkpoint's "+rec.Confirmed.String())
}

// TestAnotherSystemAtTheSameAddressIsRefused: the checkpoint holds another
// database system's record for this slot name, written from the address
// this config reaches (host:port/database): that address now serves
// another system (a pg_upgrade, a dump restored in place), and events
// committed on the old one after its checkpoint may be missing. Another
// system's record from another address is another deployment sharing the
// topic (TestTwoDatabasesShareTheCheckpointTopic).
func TestAnotherSystemAtTheSameAddressIsRefused(t *testing.T) {
	k := testenv.NewKafka(t)
	e := newEnv(t, k)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := wal.Connect(ctx, e.cfg.Postgres, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	address := conn.Address()
	conn.Close(ctx)
	store, err := checkpoint.OpenStore(ctx, e.cfg.Checkpoint.Topic, sink.ClientOpts(sink.Config{Brokers: k.Brokers}, hclog.NewNullLogger()), hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	store.SignWith(e.cfg.Checkpoint.SigningKeys) // the operator's record, as cdc reset writes one
	const oldSystem = "7000000000000000001"
	if err := store.Save(ctx, checkpoint.Record{Slot: "outbox_cdc", SystemID: oldSystem, Timeline: 1, Address: address,
		Confirmed: 0x5000000, UpdatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	gap := wantGap(t, e, checkpoint.GapOtherSystem, "belongs to database system "+oldSystem, "this server is system "+systemID(t, e.db))
	if gap.Checkpoint.Address != address {
		t.Errorf("the gap names a checkpoint from %q, want %q", gap.Checkpoint.Address, address)
	}
	if testenv.SlotPosition(t, e.db, "outbox_cdc") != 0 {
		t.Fatal("a slot was created")
	}
}

// TestExistingSlotIsAdopted: a slot from before the checkpoint store (an
// upgrade) gets a checkpoint at its position and streams on.
func TestExistingSlotIsAdopted(t *testing.T) {
	e := newEnv(t, testenv.NewKafka(t))
	testenv.Exec(t, e.db, `CREATE PUBLICATION outbox_cdc FOR TABLE outbox WITH (publish = 'insert')`,
		`SELECT pg_create_logical_replication_slot('outbox_cdc', 'pgoutput')`)
	before := insertEvent(t, testenv.Connect(t, e.db), "a-1", "BeforeStart")
	e.start(t)
	c := e.kafka.NewConsumer(t, e.kafka.AllTopics())
	c.WaitFor(t, time.Minute, "the event written before the first start", func(recs []*kgo.Record) bool { return ids(recs)[before] > 0 })
	if _, ok := loadCheckpoint(t, e); !ok {
		t.Fatal("no checkpoint written for the adopted slot")
	}
}
