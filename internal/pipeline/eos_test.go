package pipeline_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/outboxcdc/cdc/internal/pipeline"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// TestExactlyOnceDelivers: in exactly-once mode every event arrives once
// for a read_committed consumer, with its content, and the slot is
// confirmed once the transaction that holds it committed; a restart does
// not send again what a committed transaction holds.
func TestExactlyOnceDelivers(t *testing.T) {
	kafka := testenv.NewKafka(t)
	e := newEnv(t, kafka)
	e.cfg.Delivery = pipeline.DeliveryExactlyOnce
	r := e.start(t)
	conn := connect(t, e.db)
	want := map[string]bool{}
	for i := 0; i < 500; i++ {
		want[insertEvent(t, conn, fmt.Sprintf("agg-%d", i%10), "Created")] = true
	}
	c := kafka.NewCommittedConsumer(t, kafka.AllTopics())
	c.WaitCount(t, time.Minute, len(want))
	end := testenv.CurrentWAL(t, e.db)
	testenv.Eventually(t, 30*time.Second, "the slot to pass the events", func() bool { return testenv.SlotPosition(t, e.db, "outbox_cdc") >= end })
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	// A second start sends nothing again.
	r = e.start(t)
	for i := 0; i < 100; i++ {
		want[insertEvent(t, conn, "agg-x", "Again")] = true
	}
	c.WaitCount(t, time.Minute, len(want))
	c.Settle(time.Second)
	got := ids(c.Records)
	for id := range want {
		if got[id] != 1 {
			t.Errorf("event %s arrived %d times", id, got[id])
		}
	}
	if len(c.Records) != len(want) {
		t.Errorf("%d records, want %d", len(c.Records), len(want))
	}
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
}
