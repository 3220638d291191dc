package pipeline_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxcdc/cdc/internal/config"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/pipeline"
	"github.com/outboxcdc/cdc/internal/route"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// Retention (issue 40; docs/operations.md, "Retention"): the connector
// deletes the rows it has published, never one whose event Kafka has not
// acknowledged.

// retentionOutage is CDC_RETENTION_OUTAGE, 30 s by default.
func retentionOutage(t *testing.T) time.Duration {
	if v := os.Getenv("CDC_RETENTION_OUTAGE"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	return 30 * time.Second
}

// TestRetentionKeepsWhatKafkaHasNot: retention.after 1s, two replicas, the
// least-privileged role with DELETE on the outbox, a writer committing
// throughout, and a broker that takes no record for 30 s. Meanwhile no row
// whose event Kafka has not acknowledged leaves the table (checked every
// half second against what a consumer read), in both delivery modes (read
// read_committed in exactly-once mode, where only a committed Kafka
// transaction counts). Afterwards every event has arrived, the table holds
// only rows younger than after, and the standby deleted nothing.
func TestRetentionKeepsWhatKafkaHasNot(t *testing.T) {
	outage := retentionOutage(t)
	for _, mode := range []string{config.DeliveryAtLeastOnce, config.DeliveryExactlyOnce} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			kafka := testenv.NewFakeKafka(t)
			e := newEnv(t, kafka)
			e.cfg.Delivery = mode
			// The two run at once on one server: a slot each.
			e.cfg.Postgres.Slot = map[string]string{config.DeliveryAtLeastOnce: "retention_alo", config.DeliveryExactlyOnce: "retention_eos"}[mode]
			e.cfg.Postgres.URL = testenv.LeastPrivileged(t, e.db, "outbox", true)
			var role string
			testenv.QueryRow(t, e.cfg.Postgres.URL, `SELECT current_user`, nil, &role)
			testenv.Exec(t, e.db, `GRANT DELETE ON outbox TO `+role)
			e.cfg.Tables[0].Retention = &outbox.Retention{After: time.Second}

			var blocked atomic.Bool
			release := make(chan struct{})
			var releaseOnce sync.Once
			unblock := func() { releaseOnce.Do(func() { blocked.Store(false); close(release) }) }
			t.Cleanup(unblock)
			kafka.Fake.ControlKey(int16(kmsg.Produce), func(kr kmsg.Request) (kmsg.Response, error, bool) {
				kafka.Fake.KeepControl()
				if blocked.Load() {
					for _, tp := range kr.(*kmsg.ProduceRequest).Topics {
						if tp.Topic != e.cfg.Checkpoint.Topic {
							kafka.Fake.SleepControl(func() { <-release })
							break
						}
					}
				}
				return nil, nil, false
			})

			holder := e.start(t)
			standby := e.launch(t, discard{})
			waitDetail(t, standby, "standby")

			c := kafka.NewConsumer(t, kafka.AllTopics())
			if mode == config.DeliveryExactlyOnce {
				c = kafka.NewCommittedConsumer(t, kafka.AllTopics())
			}
			var mu sync.Mutex
			written := map[string]bool{}
			stop := make(chan struct{})
			writerDone := make(chan error, 1)
			go func() {
				conn := testenv.Connect(t, e.db)
				for i := 0; ; i++ {
					select {
					case <-stop:
						writerDone <- nil
						return
					default:
					}
					var id string
					if err := conn.QueryRow(context.Background(), `INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('order', $1, 'E', '{}') RETURNING id::text`,
						fmt.Sprintf("r-%d", i%5)).Scan(&id); err != nil {
						writerDone <- err
						return
					}
					mu.Lock()
					written[id] = true
					mu.Unlock()
					time.Sleep(20 * time.Millisecond) // the writer's pace: the load, not a synchronisation
				}
			}()
			c.WaitFor(t, time.Minute, "events before the outage", func(recs []*kgo.Record) bool { return len(recs) >= 50 })
			blocked.Store(true)
			deadline := time.Now().Add(outage)
			checks := 0
			var early []string
			for time.Now().Before(deadline) {
				// The rows written so far, before the table is read: a row
				// written after the read is in neither.
				mu.Lock()
				before := make([]string, 0, len(written))
				for id := range written {
					before = append(before, id)
				}
				mu.Unlock()
				c.Settle(t)
				delivered := ids(c.Records)
				inTable := map[string]bool{}
				for id := range outboxRows(t, e.db) {
					inTable[id] = true
				}
				var gone []string
				for _, id := range before {
					if delivered[id] == 0 && !inTable[id] {
						gone = append(gone, id)
					}
				}
				if len(gone) > 0 {
					// A row deleted after the read above and before the
					// table was read had its event acknowledged before
					// it went: read to the topics' end again.
					c.Settle(t)
					delivered = ids(c.Records)
					for _, id := range gone {
						if delivered[id] == 0 {
							t.Errorf("row %s left the table before Kafka acknowledged its event (%s into the outage; checkpoint confirmed %s)",
								id, time.Since(deadline.Add(-outage)).Round(time.Millisecond), holder.p.SavedForTest().Confirmed)
							early = append(early, id)
						}
					}
					if len(early) > 0 {
						break
					}
				}
				checks++
				time.Sleep(100 * time.Millisecond) // the interval between looks, each a connection: the sweeps run on their own
			}
			unblock()
			close(stop)
			if err := <-writerDone; err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			total := len(written)
			mu.Unlock()
			c.WaitFor(t, 2*time.Minute, fmt.Sprintf("all %d events", total), func(recs []*kgo.Record) bool { return len(ids(recs)) >= total })
			if len(early) > 0 {
				got := ids(c.Records)
				for _, id := range early {
					lsn := ""
					for _, r := range c.Records {
						if testenv.Header(r, route.HeaderID) == id {
							lsn = testenv.Header(r, route.HeaderCommitLSN)
						}
					}
					t.Logf("row %s deleted early: its event arrived in the end: %v, commit lsn %s", id, got[id] > 0, lsn)
				}
				t.FailNow()
			}
			// The counter is added to after each DELETE commits: it is waited
			// on with the table, not read the moment the table is empty.
			deletedRows := func() float64 {
				return testenv.Counter(t, holder.p.Metrics().Registry, "cdc_retention_rows_deleted_total", "table", "public.outbox")
			}
			testenv.Eventually(t, time.Minute, "the table to hold only rows younger than after, and most counted as deleted", func() bool {
				var old int
				testenv.QueryRow(t, e.db, `SELECT count(*) FROM outbox`, nil, &old)
				return old == 0 && deletedRows() >= float64(total)/2 // the writer stopped over a second ago
			})
			deleted := deletedRows()
			if deleted < float64(total)/2 || testenv.Counter(t, standby.p.Metrics().Registry, "cdc_retention_rows_deleted_total", "table", "public.outbox") != 0 {
				t.Errorf("the holder deleted %v rows of %d; want most, and the standby none", deleted, total)
			}
			t.Logf("%s: %d events, %d checks during a %s outage, %v rows deleted", mode, total, checks, outage, deleted)
		})
	}
}

// TestRetentionDropsPartitions: retention.mode drop_partitions on a table
// partitioned by time, whose two oldest partitions' ranges end a few
// seconds after the start. Rows written into them keep them while Kafka
// does not acknowledge their events, though their ranges ended longer
// than retention.after ago; once it does, both are detached and dropped.
// The current partition and the default partition stay, and every event
// arrived.
func TestRetentionDropsPartitions(t *testing.T) {
	kafka := testenv.NewFakeKafka(t)
	e := newEnv(t, kafka)
	t0 := time.Now().UTC().Truncate(time.Second)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	testenv.Exec(t, e.db, `DROP TABLE outbox`, partitionedByTime,
		partitionOf("outbox_old2", at(-time.Hour), at(3*time.Second)), partitionOf("outbox_old1", at(3*time.Second), at(6*time.Second)),
		partitionOf("outbox_now", at(6*time.Second), at(time.Hour)), `CREATE TABLE outbox_default PARTITION OF outbox DEFAULT`)
	e.cfg.Tables[0].Retention = &outbox.Retention{After: time.Second, Mode: outbox.RetentionDropPartitions}
	block := blockEvents(t, kafka, e.cfg.Checkpoint.Topic)
	r := e.start(t)
	block.on()
	var want []string
	for _, d := range []time.Duration{time.Second, 4 * time.Second, 30 * time.Minute, 2 * time.Hour} {
		var id string
		testenv.QueryRow(t, e.db, `INSERT INTO outbox (created_at, aggregatetype, aggregateid, type, payload) VALUES ($1, 'order', 'p-1', 'E', '{}') RETURNING id::text`, []any{at(d)}, &id)
		want = append(want, id)
	}
	// Sweeps while Kafka holds the events: nothing goes, until one that
	// began after both old ranges ended more than retention.after ago
	// (at 7 s; the gauge is in whole seconds, so 8) has run.
	swept := float64(at(8 * time.Second).Unix())
	testenv.Eventually(t, time.Minute, "a sweep after both old ranges aged past retention.after", func() bool {
		if got := partitions(t, e.db); !got["outbox_old2"] || !got["outbox_old1"] {
			t.Fatalf("partitions %v: one holding an unacknowledged row was dropped", got)
		}
		time.Sleep(250 * time.Millisecond) // the interval between looks, each a connection: the sweeps run on their own
		return testenv.Counter(t, r.p.Metrics().Registry, "cdc_retention_last_run_timestamp_seconds", "table", "public.outbox") >= swept
	})
	if got := partitions(t, e.db); !got["outbox_old2"] || !got["outbox_old1"] {
		t.Fatalf("partitions %v: one holding an unacknowledged row was dropped", got)
	}
	block.off()
	c := kafka.NewConsumer(t, kafka.AllTopics())
	c.WaitFor(t, time.Minute, "the four events", func(recs []*kgo.Record) bool {
		got := ids(recs)
		for _, id := range want {
			if got[id] == 0 {
				return false
			}
		}
		return true
	})
	// The counter is incremented after the DROP commits, so it is waited
	// on with the catalog, not read the moment the catalog shows the drop.
	dropped := func() float64 {
		return testenv.Counter(t, r.p.Metrics().Registry, "cdc_retention_partitions_dropped_total", "table", "public.outbox")
	}
	testenv.Eventually(t, time.Minute, "the two old partitions dropped and counted", func() bool {
		got := partitions(t, e.db)
		return !got["outbox_old2"] && !got["outbox_old1"] && got["outbox_now"] && got["outbox_default"] && dropped() >= 2
	})
	if n := dropped(); n != 2 {
		t.Errorf("%v partitions counted as dropped, want 2", n)
	}
	if got := partitions(t, e.db); !got["outbox_now"] || !got["outbox_default"] {
		t.Errorf("partitions %v: the current or the default partition was dropped", got)
	}
}

// partitionedByTime is Debezium's layout partitioned by created_at.
const partitionedByTime = `CREATE TABLE outbox (id uuid NOT NULL DEFAULT gen_random_uuid(), created_at timestamptz NOT NULL DEFAULT now(),
	aggregatetype text NOT NULL, aggregateid text NOT NULL, type text NOT NULL, payload jsonb, PRIMARY KEY (id, created_at)) PARTITION BY RANGE (created_at)`

// partitionOf creates partition name of outbox for [from, to).
func partitionOf(name string, from, to time.Time) string {
	return fmt.Sprintf(`CREATE TABLE %s PARTITION OF outbox FOR VALUES FROM ('%s') TO ('%s')`, name, from.Format(time.RFC3339), to.Format(time.RFC3339))
}

// partitions is the outbox's partitions now, by name.
func partitions(t *testing.T, db string) map[string]bool {
	t.Helper()
	// Closed on return, not when the test ends: a test may call this in a
	// loop of looks, one connection each.
	conn := testenv.Connect(t, db)
	defer conn.Close(context.Background())
	rows, err := conn.Query(context.Background(), `SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'outbox'::regclass`)
	if err != nil {
		t.Fatal(err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, n := range names {
		got[n] = true
	}
	return got
}

// blocker holds every produce request but the checkpoint topic's while on.
type blocker struct {
	blocked atomic.Bool
	mu      sync.Mutex
	release chan struct{}
}

// blockEvents installs a blocker on kafka's fake cluster: events wait,
// checkpoints go on (keepalives still move the confirmed position while
// nothing is in flight).
func blockEvents(t *testing.T, kafka *testenv.Kafka, checkpointTopic string) *blocker {
	b := &blocker{release: make(chan struct{})}
	t.Cleanup(b.off)
	kafka.Fake.ControlKey(int16(kmsg.Produce), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		kafka.Fake.KeepControl()
		if b.blocked.Load() {
			for _, tp := range kr.(*kmsg.ProduceRequest).Topics {
				if tp.Topic != checkpointTopic {
					b.mu.Lock()
					release := b.release
					b.mu.Unlock()
					kafka.Fake.SleepControl(func() { <-release })
					break
				}
			}
		}
		return nil, nil, false
	})
	return b
}

func (b *blocker) on() {
	b.mu.Lock()
	b.release = make(chan struct{})
	b.mu.Unlock()
	b.blocked.Store(true)
}

func (b *blocker) off() {
	if b.blocked.CompareAndSwap(true, false) {
		b.mu.Lock()
		close(b.release)
		b.mu.Unlock()
	}
}

// TestRetentionCheck: cdc check names the privilege retention needs, as
// a statement to run: DELETE on the table for mode delete; and cdc status
// shows what a table with retention keeps.
func TestRetentionCheck(t *testing.T) {
	e := newEnv(t, testenv.NewKafka(t))
	e.cfg.Postgres.URL = testenv.LeastPrivileged(t, e.db, "outbox", true)
	e.cfg.Tables[0].Retention = &outbox.Retention{After: time.Hour}
	var role string
	testenv.QueryRow(t, e.cfg.Postgres.URL, `SELECT current_user`, nil, &role)
	check := func() error {
		p, err := pipeline.New(e.cfg, hclog.NewNullLogger(), pipeline.Options{})
		if err != nil {
			t.Fatal(err)
		}
		_, err = p.Ops().Check(context.Background())
		return err
	}
	want := "GRANT DELETE ON public.outbox TO " + role
	if err := check(); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("check: %v; want it to say %q", err, want)
	}
	testenv.Exec(t, e.db, want)
	if err := check(); err != nil && strings.Contains(err.Error(), "DELETE") {
		t.Fatalf("check after the grant: %v", err)
	}
	insertEvent(t, testenv.Connect(t, e.db), "a-1", "E")
	p, err := pipeline.New(e.cfg, hclog.NewNullLogger(), pipeline.Options{})
	if err != nil {
		t.Fatal(err)
	}
	st, err := p.Ops().Status(context.Background())
	if err != nil || len(st.Retention) != 1 || st.Retention[0].Rows != 1 || st.Retention[0].Table != "public.outbox" {
		t.Fatalf("status: %+v, %v; want the table's retention with its 1 row", st.Retention, err)
	}
}
