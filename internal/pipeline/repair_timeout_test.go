package pipeline_test

import (
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxcdc/cdc/internal/config"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/route"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// TestRepairOutlastingTheKafkaTransaction (found by the attack on issue
// 53): in exactly-once mode a repair's rows go in one Kafka transaction.
// A table whose rows took longer to send than the brokers keep a
// transaction open was repaired by every session again, for ever (or, on
// a broker that does not abort, held its transaction open past the
// timeout). The repair stops the connector at three quarters of
// exactly_once.transaction_timeout, naming the setting; with the timeout
// raised, every row arrives once. Kafka's answers are slowed here
// (fault injection, not synchronization).
func TestRepairOutlastingTheKafkaTransaction(t *testing.T) {
	kafka := testenv.NewFakeKafka(t)
	e := newEnv(t, kafka)
	e.cfg.Delivery = config.DeliveryExactlyOnce
	e.cfg.ExactlyOnce.TransactionTimeout = 2 * time.Second
	e.cfg.MaxInFlight = 20
	e.cfg.Tables[0].Backfill = &outbox.BackfillOptions{ChunkSize: 10} // the repair's chunks too
	r := e.start(t)
	conn := testenv.Connect(t, e.db)
	insertEvent(t, conn, "old", "Created")
	c := e.kafka.NewCommittedConsumer(t, e.kafka.AllTopics())
	c.WaitCount(t, time.Minute, 1)
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	testenv.Exec(t, e.db, recreateSQL)
	testenv.Exec(t, e.db, `INSERT INTO outbox (aggregatetype, aggregateid, type, payload) SELECT 'order', 'new-' || (i % 10), 'Created', '{}' FROM generate_series(1, 200) i`)
	var slow atomic.Bool
	slow.Store(true)
	kafka.Fake.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		kafka.Fake.KeepControl()
		if slow.Load() {
			kafka.Fake.SleepControl(func() { time.Sleep(500 * time.Millisecond) })
		}
		return nil, nil, false
	})
	r = e.launch(t, os.Stderr)
	err, stopped := waitStop(r, 40*time.Second)
	if !stopped {
		r.stop(t)
		t.Fatal("the repair went on past exactly_once.transaction_timeout")
	}
	if err == nil || !strings.Contains(err.Error(), "exactly_once.transaction_timeout") || !strings.Contains(err.Error(), "public.outbox") {
		t.Fatalf("stopped with %v; want the repair's table and exactly_once.transaction_timeout named", err)
	}
	// The remedy: a timeout the repair fits in. Every row arrives once
	// (read_committed): nothing of the stopped repair was taken as sent.
	slow.Store(false)
	e.cfg.ExactlyOnce.TransactionTimeout = time.Minute
	r = e.start(t)
	defer r.stop(t)
	c.WaitCount(t, time.Minute, 201)
	c.Settle(t)
	seen := map[string]int{}
	for _, rec := range c.Records {
		seen[testenv.Header(rec, route.HeaderID)]++
	}
	if len(c.Records) != 201 || len(seen) != 201 {
		t.Fatalf("%d records of %d events after the repair with room; want the 201 events once each", len(c.Records), len(seen))
	}
}
