package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxcdc/cdc/internal/localpg"
	"github.com/outboxcdc/cdc/internal/opt"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/pipeline"
	"github.com/outboxcdc/cdc/internal/postgres"
	"github.com/outboxcdc/cdc/internal/route"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// The first hour of a deployment (issue 23; docs/design.md, rule 20): services that start
// late or in any order, and replicas started in the same second.

// waitDetail waits until the pipeline's /readyz line contains want.
func waitDetail(t *testing.T, r *running, want string) {
	t.Helper()
	testenv.Eventually(t, time.Minute, fmt.Sprintf("/readyz to say %q", want), func() bool {
		_, detail := r.p.Ready()
		return strings.Contains(detail, want)
	})
}

// TestFirstStartBeforeKafka: the connector starts 'first' with no broker
// listening yet. It says why it does not stream, /healthz fails once it has
// not streamed for unhealthy_after, and when the broker comes up it
// creates the slot and streams (it used to loop on "a slot is created only
// by the first session" for ever).
func TestFirstStartBeforeKafka(t *testing.T) {
	port, err := localpg.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, &testenv.Kafka{Brokers: []string{fmt.Sprintf("127.0.0.1:%d", port)}, Prefix: fmt.Sprintf("late%d.", port)})
	e.cfg.UnhealthyAfter = 2 * time.Second
	r := e.launch(t, ioDiscard{})
	waitDetail(t, r, "first start, not streaming yet")
	testenv.Eventually(t, 30*time.Second, "/healthz to fail while nothing streams", func() bool { return r.p.Healthy() != nil })
	if err := r.p.Healthy(); !strings.Contains(err.Error(), "not streaming for") {
		t.Errorf("/healthz says %q; want it to say how long it has not streamed", err)
	}

	kafka := testenv.NewFakeKafka(t, kfake.Ports(port))
	kafka.Prefix = e.kafka.Prefix
	testenv.Eventually(t, time.Minute, "the pipeline to stream once Kafka is up", func() bool { return r.tracker.Load() != nil })
	if err := r.p.Healthy(); err != nil {
		t.Errorf("/healthz fails while streaming: %v", err)
	}
	id := insertEvent(t, testenv.Connect(t, e.db), "agg-1", "created")
	c := kafka.NewConsumer(t, kafka.AllTopics())
	c.WaitCount(t, 30*time.Second, 1)
	if got := testenv.Header(c.Records[0], route.HeaderID); got != id || string(c.Records[0].Key) != "agg-1" {
		t.Errorf("record id %s key %s, want %s and agg-1", got, c.Records[0].Key, id)
	}
}

// TestFirstStartBeforePostgres: the same with Postgres down at the start.
func TestFirstStartBeforePostgres(t *testing.T) {
	srv, err := testenv.StartPostgres()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	kafka := testenv.NewKafka(t)
	db := srv.NewDatabase(t)
	testenv.Exec(t, db, schema)
	if err := srv.StopKeep(); err != nil {
		t.Fatal(err)
	}
	e := &env{db: db, kafka: kafka, cfg: newEnvConfig(db, kafka)}
	r := e.launch(t, ioDiscard{})
	waitDetail(t, r, "first start, not streaming yet")
	if err := srv.StartAgain(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, time.Minute, "the pipeline to stream once Postgres is up", func() bool { return r.tracker.Load() != nil })
	id := insertEvent(t, testenv.Connect(t, db), "agg-1", "created")
	c := kafka.NewConsumer(t, kafka.AllTopics())
	c.WaitFor(t, 30*time.Second, "the event", func(recs []*kgo.Record) bool { return ids(recs)[id] == 1 })
}

// TestReplicasStartTogether: two replicas of one config with a first-start
// backfill, running as the least-privileged role, started in the same
// instant, three times over. Neither stops;
// one streams, the other waits as a standby (it used to lose the CREATE
// PUBLICATION race and exit, or stream the slot while the first was still
// backfilling and send every pending row again); every pending and live row
// arrives once; and after the active one stops, the standby streams.
func TestReplicasStartTogether(t *testing.T) {
	for round := range 3 {
		t.Run(fmt.Sprint(round), func(t *testing.T) {
			kafka := testenv.NewKafka(t)
			db := testenv.Require(t, pg).NewDatabase(t)
			testenv.Exec(t, db, pollerSchema, `INSERT INTO event_outbox (aggregate_type, aggregate_id, event_type, payload)
				SELECT 'order', 'agg-' || (i % 50), 'old', jsonb_build_object('i', i) FROM generate_series(1, 3000) i`)
			cfg := newEnvConfig(testenv.LeastPrivileged(t, db, "event_outbox", true), kafka)
			cfg.Tables = []*outbox.Source{pollerTable(kafka.Prefix, &outbox.BackfillOptions{Where: "published_at IS NULL", OrderBy: []string{"id"}, ChunkSize: 200})}
			a := (&env{db: db, kafka: kafka, cfg: cfg}).launch(t, ioDiscard{})
			b := (&env{db: db, kafka: kafka, cfg: cfg}).launch(t, ioDiscard{})
			testenv.Eventually(t, time.Minute, "a replica to stream", func() bool { return a.tracker.Load() != nil || b.tracker.Load() != nil })
			active, standby := a, b
			if b.tracker.Load() != nil {
				active, standby = b, a
			}
			waitDetail(t, standby, "standby")
			for _, r := range []*running{a, b} {
				select {
				case err := <-r.done:
					t.Fatalf("a replica stopped: %v", err)
				default:
				}
			}
			testenv.Exec(t, db, `INSERT INTO event_outbox (aggregate_type, aggregate_id, event_type, payload)
				SELECT 'order', 'agg-' || (i % 50), 'live', jsonb_build_object('i', i) FROM generate_series(3001, 3200) i`)
			c := kafka.NewConsumer(t, kafka.AllTopics())
			c.WaitCount(t, time.Minute, 3200)

			// The standby takes over once the active one stops.
			if err := active.stop(t); err != nil {
				t.Fatal(err)
			}
			testenv.Eventually(t, time.Minute, "the standby to stream", func() bool { return standby.tracker.Load() != nil })
			testenv.Exec(t, db, `INSERT INTO event_outbox (aggregate_type, aggregate_id, event_type, payload)
				SELECT 'order', 'agg-' || (i % 50), 'after', jsonb_build_object('i', i) FROM generate_series(3201, 3300) i`)
			c.WaitCount(t, time.Minute, 3300)
			c.SettleConfirmed(t, time.Minute, db, "outbox_cdc")
			got := ids(c.Records)
			for i := 1; i <= 3300; i++ {
				if n := got[fmt.Sprint(i)]; n != 1 {
					t.Errorf("row %d arrived %d times", i, n)
				}
			}
			if len(c.Records) != 3300 {
				t.Errorf("%d records, want 3300", len(c.Records))
			}
			if err := standby.stop(t); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestStandbyLeavesABusyHolder (issue 23, item 3): the slot's holder blocks
// for four takeover_afters creating a topic (the broker holds the admin
// call). It keeps sending Postgres status updates meanwhile, so the standby
// does not take it for frozen; the event then arrives from the same holder.
func TestStandbyLeavesABusyHolder(t *testing.T) {
	kafka := testenv.NewFakeKafka(t)
	e := newEnv(t, kafka)
	e.cfg.Standby.TakeoverAfter = opt.Set(time.Second)
	a := e.start(t)
	b := e.launch(t, ioDiscard{})
	waitDetail(t, b, "standby")

	release := make(chan struct{})
	var held atomic.Bool
	kafka.Fake.ControlKey(int16(kmsg.CreateTopics), func(kmsg.Request) (kmsg.Response, error, bool) {
		kafka.Fake.KeepControl()
		if held.CompareAndSwap(false, true) {
			kafka.Fake.SleepControl(func() { <-release })
		}
		return nil, nil, false
	})
	id := insertEvent(t, testenv.Connect(t, e.db), "agg-1", "created")
	testenv.Eventually(t, 30*time.Second, "the holder to block creating the topic", held.Load)
	// The broker holds the call for four takeover_afters (the fault), and
	// until the standby has looked at the slot eight times since (each
	// look a session that finds the slot in use, takeover_after/4 apart):
	// two takeover_afters of looks, however slowly a loaded machine runs
	// them, in which a standby that took the busy holder for silent would
	// have ended it.
	looks := counterValue(b.p.Metrics().Restarts)
	hold := time.NewTimer(4 * e.cfg.TakeoverAfter())
	<-hold.C
	testenv.Eventually(t, time.Minute, "the standby to look eight times", func() bool { return counterValue(b.p.Metrics().Restarts) >= looks+8 })
	close(release)
	c := kafka.NewConsumer(t, kafka.AllTopics())
	c.WaitFor(t, 30*time.Second, "the event", func(recs []*kgo.Record) bool { return ids(recs)[id] == 1 })
	if b.tracker.Load() != nil {
		t.Fatal("the standby took over a holder that was busy, not frozen")
	}
	if ok, detail := a.p.Ready(); !ok {
		t.Errorf("the holder stopped streaming: %s", detail)
	}
}

// TestStandbyLooksAgainAtAStartingReplica (issue 55): a standby that finds
// another replica starting (it holds the start lock, for a first start's
// backfill say) looks again within takeover_after/4, as it does at a
// holder, not a whole retry backoff later: should that replica freeze
// once it streams, the takeover comes within takeover_after.
func TestStandbyLooksAgainAtAStartingReplica(t *testing.T) {
	cfg := newEnvConfig("postgres://cdc@127.0.0.1:1/app", &testenv.Kafka{Brokers: []string{"127.0.0.1:1"}})
	cfg.RetryBackoff, cfg.RetryBackoffMax = time.Second, time.Minute
	cfg.Standby.TakeoverAfter = opt.Set(8 * time.Second)
	p, err := pipeline.New(cfg, hclog.NewNullLogger(), pipeline.Options{})
	if err != nil {
		t.Fatal(err)
	}
	starting := &postgres.SlotInUseError{Slot: "outbox_cdc", Err: postgres.ErrStarting}
	if wait := p.RetryWaitForTest(context.Background(), starting); wait > 2*time.Second || wait <= 0 {
		t.Fatalf("a standby waits %s after finding another replica starting; want at most takeover_after/4 (2s)", wait)
	}
	if wait := p.RetryWaitForTest(context.Background(), errors.New("kafka is down")); wait < 10*time.Second {
		t.Fatalf("after another error it waits %s; want the backoff (the cap is a standby's)", wait)
	}
}
