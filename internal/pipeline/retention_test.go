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
				c.Settle(500 * time.Millisecond)
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
					// The consumer may not have read yet what Kafka
					// acknowledged before the block; nothing new is
					// acknowledged during it, so a longer read settles it.
					c.Settle(3 * time.Second)
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
			testenv.Eventually(t, time.Minute, "the table to hold only rows younger than after", func() bool {
				var old int
				testenv.QueryRow(t, e.db, `SELECT count(*) FROM outbox`, nil, &old)
				return old == 0 // the writer stopped over a second ago
			})
			deleted := testenv.Counter(t, holder.p.Metrics().Registry, "cdc_retention_rows_deleted_total", "table", "public.outbox")
			if deleted < float64(total)/2 || testenv.Counter(t, standby.p.Metrics().Registry, "cdc_retention_rows_deleted_total", "table", "public.outbox") != 0 {
				t.Errorf("the holder deleted %v rows of %d; want most, and the standby none", deleted, total)
			}
			t.Logf("%s: %d events, %d checks during a %s outage, %v rows deleted", mode, total, checks, outage, deleted)
		})
	}
}

// TestRetentionDropsPartitions: retention.mode drop_partitions on a table
// partitioned by month. Rows written now into two past months' partitions
// keep them while Kafka does not acknowledge their events; once it does,
// and retention.after has passed, both are detached and dropped. The
// current month's partition and the default partition stay, and every
// event arrived.
func TestRetentionDropsPartitions(t *testing.T) {
	kafka := testenv.NewFakeKafka(t)
	e := newEnv(t, kafka)
	now := time.Now().UTC()
	month := func(d int) time.Time {
		return time.Date(now.Year(), now.Month()+time.Month(d), 1, 0, 0, 0, 0, time.UTC)
	}
	part := func(name string, from, to time.Time) string {
		return fmt.Sprintf(`CREATE TABLE %s PARTITION OF outbox FOR VALUES FROM ('%s') TO ('%s')`, name, from.Format(time.RFC3339), to.Format(time.RFC3339))
	}
	testenv.Exec(t, e.db, `DROP TABLE outbox`, `CREATE TABLE outbox (id uuid NOT NULL DEFAULT gen_random_uuid(), created_at timestamptz NOT NULL DEFAULT now(),
		aggregatetype text NOT NULL, aggregateid text NOT NULL, type text NOT NULL, payload jsonb, PRIMARY KEY (id, created_at)) PARTITION BY RANGE (created_at)`,
		part("outbox_old2", month(-2), month(-1)), part("outbox_old1", month(-1), month(0)), part("outbox_now", month(0), month(1)),
		`CREATE TABLE outbox_default PARTITION OF outbox DEFAULT`)
	e.cfg.Tables[0].Retention = &outbox.Retention{After: time.Second, Mode: outbox.RetentionDropPartitions}
	var blocked atomic.Bool
	release := make(chan struct{})
	var once sync.Once
	unblock := func() { once.Do(func() { blocked.Store(false); close(release) }) }
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
	r := e.start(t)
	blocked.Store(true)
	var want []string
	for _, at := range []time.Time{month(-2).Add(time.Hour), month(-1).Add(time.Hour), now, month(5)} {
		var id string
		testenv.QueryRow(t, e.db, `INSERT INTO outbox (created_at, aggregatetype, aggregateid, type, payload) VALUES ($1, 'order', 'p-1', 'E', '{}') RETURNING id::text`, []any{at}, &id)
		want = append(want, id)
	}
	partitions := func() map[string]bool {
		rows, err := testenv.Connect(t, e.db).Query(context.Background(), `SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'outbox'::regclass`)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]bool{}
		for rows.Next() {
			var n string
			rows.Scan(&n)
			got[n] = true
		}
		return got
	}
	// Several sweeps while Kafka holds the events: nothing goes.
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if got := partitions(); !got["outbox_old2"] || !got["outbox_old1"] {
			t.Fatalf("partitions %v: one holding an unacknowledged row was dropped", got)
		}
		time.Sleep(250 * time.Millisecond) // the interval between looks: the sweeps run on their own
	}
	unblock()
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
	testenv.Eventually(t, time.Minute, "the two past months' partitions dropped", func() bool {
		got := partitions()
		return !got["outbox_old2"] && !got["outbox_old1"] && got["outbox_now"] && got["outbox_default"]
	})
	if n := testenv.Counter(t, r.p.Metrics().Registry, "cdc_retention_partitions_dropped_total", "table", "public.outbox"); n != 2 {
		t.Errorf("%v partitions counted as dropped, want 2", n)
	}
	for _, rec := range c.Records {
		if testenv.Header(rec, route.HeaderID) == "" {
			t.Errorf("a record without an id: %v", rec)
		}
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
