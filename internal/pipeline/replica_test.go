//go:build replica

package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/config"
	"github.com/outboxcdc/cdc/internal/errtext"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/postgres"
	"github.com/outboxcdc/cdc/internal/replay"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// TestReplica (issue 42, make test-replica, PostgreSQL 16+): the
// connector streams from a hot standby, with postgres.primary_url for
// what the standby cannot write. One primary and standby pair serves the
// subtests, each in a database of its own made on the primary.
func TestReplica(t *testing.T) {
	pair := testenv.StartReplicaPair(t)
	// standbyEnv is an env whose connector reaches the standby, and the
	// primary by primary_url; rows are written on the primary.
	standbyEnv := func(t *testing.T) (e *env, primary string) {
		primary, standby := pair.NewDatabase(t)
		dropSlots(t, standby)
		testenv.Exec(t, primary, schema)
		pair.CaughtUp(t)
		kafka := testenv.NewKafka(t)
		e = &env{db: standby, kafka: kafka, cfg: newEnvConfig(standby, kafka)}
		e.cfg.Postgres.PrimaryURL = primary
		return e, primary
	}

	// The slot is the standby's, the publication made on the primary, and
	// every event written on the primary arrives once, in its topic with
	// its key; a quiet outbox in a busy database keeps the standby's slot
	// moving.
	t.Run("streams", func(t *testing.T) {
		e, primary := standbyEnv(t)
		r := e.start(t)
		var onStandby, onPrimary int
		testenv.QueryRow(t, e.db, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'outbox_cdc'`, nil, &onStandby)
		testenv.QueryRow(t, primary, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'outbox_cdc'`, nil, &onPrimary)
		if onStandby != 1 || onPrimary != 0 {
			t.Fatalf("slot outbox_cdc: %d on the standby, %d on the primary; want it on the standby only", onStandby, onPrimary)
		}
		var pub bool
		testenv.QueryRow(t, primary, `SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = 'outbox_cdc' AND pubviaroot)`, nil, &pub)
		if !pub {
			t.Fatal("the publication was not made on the primary")
		}
		conn := testenv.Connect(t, primary)
		for i := 0; i < 300; i++ {
			insertEvent(t, conn, fmt.Sprintf("agg-%d", i%7), "Created")
		}
		expectEvents(t, e.kafka.NewConsumer(t, e.kafka.AllTopics()), outboxRows(t, primary), 0)

		// Only other tables change now: the slot on the standby follows.
		for i := 0; i < 200; i++ {
			testenv.Exec(t, primary, `INSERT INTO other (note) VALUES ('busy')`)
		}
		pair.CaughtUp(t)
		var end string
		testenv.QueryRow(t, e.db, `SELECT pg_last_wal_replay_lsn()::text`, nil, &end)
		testenv.Eventually(t, time.Minute, "the standby's slot to pass the other tables' writes", func() bool {
			var passed bool
			testenv.QueryRow(t, e.db, `SELECT confirmed_flush_lsn >= $1::pg_lsn FROM pg_replication_slots WHERE slot_name = 'outbox_cdc'`, []any{end}, &passed)
			return passed
		})
		if err := r.stop(t); err != nil {
			t.Fatal(err)
		}
	})

	// Without primary_url, a missing publication is a clear stop with
	// the statement to run on the primary; once it was run there, the
	// connector streams from the standby alone.
	t.Run("without primary_url", func(t *testing.T) {
		e, primary := standbyEnv(t)
		e.cfg.Postgres.PrimaryURL = ""
		err := waitFatal(t, e.launch(t, discard{}))
		var se *postgres.StandbyError
		if !errors.As(err, &se) || !strings.Contains(err.Error(), "postgres.primary_url") || !strings.Contains(err.Error(), "CREATE PUBLICATION outbox_cdc FOR TABLE ONLY public.outbox") {
			t.Fatalf("got %v; want a StandbyError naming postgres.primary_url and the CREATE PUBLICATION to run", err)
		}
		testenv.Exec(t, primary, `CREATE PUBLICATION outbox_cdc FOR TABLE public.outbox WITH (publish = 'insert', publish_via_partition_root = true)`)
		pair.CaughtUp(t)
		// Without primary_url the slot's creation waits for the primary to
		// log its running transactions, which its bgwriter does about every
		// 15 s while it writes, later on a loaded machine: the test logs
		// them itself, as an operator would, until the connector streams.
		r := e.launch(t, os.Stderr)
		testenv.Eventually(t, 2*time.Minute, "the pipeline to start streaming from the standby", func() bool {
			select {
			case err := <-r.done:
				close(r.done)
				t.Fatalf("the pipeline stopped before it streamed: %v", err)
			default:
			}
			testenv.Exec(t, primary, `SELECT pg_log_standby_snapshot()`)
			return r.tracker.Load() != nil
		})
		conn := testenv.Connect(t, primary)
		for i := 0; i < 50; i++ {
			insertEvent(t, conn, fmt.Sprintf("agg-%d", i%3), "Created")
		}
		expectEvents(t, e.kafka.NewConsumer(t, e.kafka.AllTopics()), outboxRows(t, primary), 0)
		if err := r.stop(t); err != nil {
			t.Fatal(err)
		}
	})

	// A first start's backfill reads the standby's exported snapshot: the
	// rows written before the slot each once, and those after, once.
	t.Run("first-start backfill", func(t *testing.T) {
		e, primary := standbyEnv(t)
		testenv.Exec(t, primary, `INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
			SELECT 'order', 'b-' || (i % 9), 'Pending', '{}' FROM generate_series(1, 200) i`)
		pair.CaughtUp(t)
		e.cfg.Tables[0].Backfill = &outbox.BackfillOptions{ChunkSize: 50}
		r := e.start(t)
		conn := testenv.Connect(t, primary)
		for i := 0; i < 20; i++ {
			insertEvent(t, conn, "after", "Created")
		}
		expectEvents(t, e.kafka.NewConsumer(t, e.kafka.AllTopics()), outboxRows(t, primary), 0)
		if err := r.stop(t); err != nil {
			t.Fatal(err)
		}
	})

	// A replay from the standby: the replay window's slot is the
	// standby's too, the replay ends at what the standby has replayed,
	// and a range of events written on the primary is sent again, each
	// once, in per-key order.
	t.Run("replay", func(t *testing.T) {
		e, primary := standbyEnv(t)
		e.cfg.Replay.Window = time.Hour
		r := e.start(t)
		c := e.kafka.NewConsumer(t, e.kafka.AllTopics())
		conn := testenv.Connect(t, primary)
		var events []string
		for i := 0; i < 30; i++ {
			events = append(events, insertEvent(t, conn, fmt.Sprintf("k-%d", i%5), "E"))
		}
		c.WaitFor(t, time.Minute, "the 30 events", func(recs []*kgo.Record) bool {
			got := ids(recs)
			for _, id := range events {
				if got[id] == 0 {
					return false
				}
			}
			return true
		})
		from, to := commitOf(c.Records, events[10]), commitOf(c.Records, events[20])
		sum, err := e.newPipeline(t).Replay(context.Background(), replay.Request{Range: replay.Range{FromLSN: from, ToLSN: to}, TopicSuffix: ".replay"}, nil)
		if err != nil {
			t.Fatalf("replay from the standby: %v", err)
		}
		if sum.Events != 10 || sum.FirstCommit != from {
			t.Fatalf("summary %+v; want 10 events from %s", sum, from)
		}
		replayed(t, e, ".replay", events[10:20])
		if err := r.stop(t); err != nil {
			t.Fatal(err)
		}
	})

	// hot_standby_feedback off is refused at start; a slot that Postgres
	// invalidated on the standby (the primary's vacuum removed catalog rows
	// it needed) is a clear stop that names the setting.
	t.Run("conflict", func(t *testing.T) {
		e, primary := standbyEnv(t)
		r := e.start(t)
		if err := r.stop(t); err != nil {
			t.Fatal(err)
		}
		setFeedback := func(on string) {
			testenv.Exec(t, pair.Standby.URL, `ALTER SYSTEM SET hot_standby_feedback = `+on, `SELECT pg_reload_conf()`)
			testenv.Eventually(t, 30*time.Second, "hot_standby_feedback "+on, func() bool {
				var v string
				testenv.QueryRow(t, e.db, `SHOW hot_standby_feedback`, nil, &v)
				return v == on
			})
		}
		setFeedback("off")
		err := waitFatal(t, e.launch(t, discard{}))
		if !errors.As(err, new(*errtext.Fatal)) || !strings.Contains(err.Error(), "hot_standby_feedback") {
			t.Fatalf("with hot_standby_feedback off: got %v; want a setup error naming it", err)
		}
		// Dead catalog rows on the primary, vacuumed while nothing holds
		// them back, until the standby's replay invalidates the slot.
		testenv.Eventually(t, 2*time.Minute, "the slot on the standby to be invalidated", func() bool {
			testenv.Exec(t, primary, `CREATE TABLE conflict_test (x int)`, `DROP TABLE conflict_test`, `VACUUM pg_class`)
			var conflicting bool
			testenv.QueryRow(t, e.db, `SELECT coalesce(conflicting, false) FROM pg_replication_slots WHERE slot_name = 'outbox_cdc'`, nil, &conflicting)
			return conflicting
		})
		setFeedback("on")
		err = waitFatal(t, e.launch(t, discard{}))
		if !errors.Is(err, postgres.ErrSlotLost) || !strings.Contains(err.Error(), "invalidated") || !strings.Contains(err.Error(), "hot_standby_feedback = on") {
			t.Fatalf("with the slot invalidated: got %v; want a lost-slot error that names hot_standby_feedback", err)
		}
	})

	// Retention on a standby's connector deletes on the primary
	// (primary_url); once the standby is promoted, it deletes on the
	// promoted server, and never on the old primary, which goes on as a
	// split brain: the rows written there were never streamed.
	t.Run("retention across a promotion", func(t *testing.T) {
		pair := testenv.StartReplicaPair(t)
		primary, standby := pair.NewDatabase(t)
		dropSlots(t, standby)
		testenv.Exec(t, primary, schema)
		pair.CaughtUp(t)
		kafka := testenv.NewKafka(t)
		e := &env{db: standby, kafka: kafka, cfg: newEnvConfig(standby, kafka), retentionInterval: 100 * time.Millisecond}
		e.cfg.Postgres.PrimaryURL = primary
		e.cfg.Tables[0].Retention = &outbox.Retention{After: time.Second}
		e.start(t)
		c := kafka.NewConsumer(t, kafka.AllTopics())
		count := func(db string) int {
			var n int
			testenv.QueryRow(t, db, `SELECT count(*) FROM outbox`, nil, &n)
			return n
		}
		write := func(db string, n int, agg string) {
			testenv.Exec(t, db, fmt.Sprintf(`INSERT INTO outbox (aggregatetype, aggregateid, type, payload) SELECT 'order', '%s', 'E', '{}' FROM generate_series(1, %d)`, agg, n))
		}
		write(primary, 50, "before")
		c.WaitCount(t, time.Minute, 50)
		testenv.Eventually(t, time.Minute, "the delivered rows deleted on the primary", func() bool { return count(primary) == 0 })
		if err := pair.Standby.Promote(); err != nil {
			t.Fatal(err)
		}
		write(primary, 30, "split-brain")
		write(standby, 40, "promoted")
		c.WaitCount(t, time.Minute, 90)
		testenv.Eventually(t, time.Minute, "the delivered rows deleted on the promoted server", func() bool { return count(standby) == 0 })
		if n := count(primary); n != 30 {
			t.Fatalf("%d of the 30 rows written on the old primary after the promotion are left: retention deleted there", n)
		}
	})

	// Promoted mid-stream, in both delivery modes: the connector streams
	// on from the promoted server, on its new timeline, without a gap and
	// without refusing one; every event it holds arrives (once, read
	// read_committed, in exactly-once mode). Last: it ends the pair's
	// standby.
	t.Run("promotion", func(t *testing.T) {
		pairs := map[string]*testenv.ReplicaPair{"at-least-once": pair, "exactly-once": testenv.StartReplicaPair(t)}
		for _, mode := range []string{"exactly-once", "at-least-once"} {
			t.Run(mode, func(t *testing.T) {
				pair := pairs[mode]
				primary, standby := pair.NewDatabase(t)
				dropSlots(t, standby)
				testenv.Exec(t, primary, schema)
				pair.CaughtUp(t)
				kafka := testenv.NewKafka(t)
				e := &env{db: standby, kafka: kafka, cfg: newEnvConfig(standby, kafka)}
				e.cfg.Postgres.PrimaryURL = primary
				if mode == "exactly-once" {
					e.cfg.Delivery = config.DeliveryExactlyOnce
				}
				r := e.start(t)
				// The application writes to whichever is the primary.
				both := fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/%s?sslmode=disable&target_session_attrs=read-write",
					pair.Primary.Port, pair.Standby.Port, dbName(primary))
				written, stopWriter := reconnectingWriter(both)
				c := kafka.NewConsumer(t, kafka.AllTopics())
				if mode == "exactly-once" {
					c = kafka.NewCommittedConsumer(t, kafka.AllTopics())
				}
				c.WaitCount(t, time.Minute, 300)
				if err := pair.Primary.Kill(); err != nil {
					t.Fatal(err)
				}
				if err := pair.Standby.Promote(); err != nil {
					t.Fatal(err)
				}
				at := written.Load()
				testenv.Eventually(t, 2*time.Minute, "writes on the promoted server", func() bool { return written.Load() > at+300 })
				stopWriter()
				select {
				case err := <-r.done:
					close(r.done)
					t.Fatalf("the connector stopped at the promotion: %v", err)
				default:
				}
				maxDups := 0
				if mode == "at-least-once" {
					maxDups = 1000
				}
				expectEvents(t, c, outboxRows(t, standby), maxDups)
				if err := r.stop(t); err != nil {
					t.Fatal(err)
				}
			})
		}
	})
}

// dropSlots drops, when the test ends, the slots of the database db
// names: a slot's name is the cluster's, and the next test's would clash.
func dropSlots(t *testing.T, db string) {
	t.Cleanup(func() {
		conn, err := pgx.Connect(context.Background(), db)
		if err != nil {
			return // promoted and gone, or the cluster stopped
		}
		defer conn.Close(context.Background())
		conn.Exec(context.Background(), `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE database = current_database() AND active_pid IS NOT NULL`)
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			var left int
			conn.QueryRow(context.Background(), `SELECT count(*) FROM (SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = current_database() AND NOT active) s`).Scan(&left)
			var remaining int
			if conn.QueryRow(context.Background(), `SELECT count(*) FROM pg_replication_slots WHERE database = current_database()`).Scan(&remaining); remaining == 0 {
				return
			}
			time.Sleep(50 * time.Millisecond) // a terminated walsender lets go of its slot shortly
		}
		t.Errorf("could not drop the replication slots of %s", dbName(db))
	})
}

// dbName is the database a URL names.
func dbName(url string) string {
	_, rest, _ := strings.Cut(url, "127.0.0.1:")
	_, rest, _ = strings.Cut(rest, "/")
	name, _, _ := strings.Cut(rest, "?")
	return name
}
