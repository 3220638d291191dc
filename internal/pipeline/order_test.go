package pipeline_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/config"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/pipeline"
	"github.com/outboxcdc/cdc/internal/route"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// An aggregate keeps its order on every path (docs/design.md, "Backfill"
// and "Table changes"; issue 53, items 10 and 11): a repair, a first
// start's backfill and cdc backfill send a table's rows in the order they
// were committed, not in the order of a random primary key, and a
// repaired table's events streamed before the repair's point never
// overtake its older rows. Each test writes many aggregates' events, one
// transaction each, interleaved, in Debezium's layout (id uuid), so that
// the keys' order differs from the commits' with near certainty, and
// checks every aggregate.

// writeSeq commits, on conn, rounds events of each of aggs aggregates
// named prefix-<n>, one transaction each, the aggregates shuffled within
// each round; each event's payload holds its aggregate and its sequence
// number, from first. It returns every id written.
func writeSeq(t *testing.T, conn *pgx.Conn, prefix string, aggs, first, rounds int) map[string]bool {
	t.Helper()
	ids := map[string]bool{}
	order := rand.Perm(aggs)
	for s := first; s < first+rounds; s++ {
		rand.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		for _, a := range order {
			ids[insertSeq(t, conn, fmt.Sprintf("%s-%d", prefix, a), s)] = true
		}
	}
	return ids
}

// insertSeq commits one event of aggregate agg with sequence number seq
// and returns its id.
func insertSeq(t *testing.T, conn *pgx.Conn, agg string, seq int) string {
	t.Helper()
	var id string
	if err := conn.QueryRow(context.Background(), `INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('order', $1, 'Seq', $2) RETURNING id::text`,
		agg, seqPayload(agg, seq)).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

// waitForIDs waits until every id in want (the keys) arrived at c.
func waitForIDs[V any](t *testing.T, c *testenv.Consumer, want map[string]V) {
	t.Helper()
	c.WaitFor(t, 2*time.Minute, fmt.Sprintf("%d events", len(want)), func(recs []*kgo.Record) bool {
		got := ids(recs)
		for id := range want {
			if got[id] == 0 {
				return false
			}
		}
		return true
	})
}

// expectCommitOrder waits until every id in want arrived, then checks
// that each arrived exactly once and that, within each aggregate, the
// sequence numbers arrived in increasing order (an aggregate's records
// share a key, so a partition: the consumer reads them in its order).
func expectCommitOrder(t *testing.T, c *testenv.Consumer, want map[string]bool) {
	t.Helper()
	waitForIDs(t, c, want)
	c.Settle(t)
	last := map[string]int{}
	reordered := map[string]bool{}
	for _, rec := range c.Records {
		id := testenv.Header(rec, route.HeaderID)
		if !want[id] {
			t.Errorf("record %s that the test did not write", id)
			continue
		}
		var ev seqEvent
		if err := json.Unmarshal(rec.Value, &ev); err != nil {
			t.Fatalf("record %s: %v", id, err)
		}
		if string(rec.Key) != ev.Agg {
			t.Errorf("record %s: key %q, want %q", id, rec.Key, ev.Agg)
		}
		if prev, ok := last[ev.Agg]; ok && ev.Seq <= prev && !reordered[ev.Agg] {
			reordered[ev.Agg] = true
			t.Errorf("%s: seq %d arrived after seq %d", ev.Agg, ev.Seq, prev)
		}
		last[ev.Agg] = ev.Seq
	}
	for id, n := range ids(c.Records) {
		if n != 1 && want[id] {
			t.Errorf("event %s arrived %d times", id, n)
		}
	}
	if len(reordered) > 0 {
		t.Errorf("%d of %d aggregates out of commit order", len(reordered), len(last))
	}
}

// TestRepairSendsInCommitOrder: the outbox is dropped and created again
// while the connector is stopped, and the new table receives 20
// aggregates' events, 15 each, one transaction each. The repair sends
// them in commit order, and the stream's events after the repair follow:
// every aggregate reads in order. It sent them in the order of their
// uuids.
func TestRepairSendsInCommitOrder(t *testing.T) {
	e := newEnv(t, testenv.NewKafka(t))
	r := e.start(t)
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	testenv.Exec(t, e.db, recreateSQL)
	conn := testenv.Connect(t, e.db)
	want := writeSeq(t, conn, "agg", 20, 0, 15)
	r = e.start(t)
	// The stream's events come after the repair (the order across the
	// repair's point is TestFreshEventsAfterTheRepairsRows').
	testenv.Eventually(t, time.Minute, "the repair", func() bool {
		return testenv.Counter(t, r.p.Metrics().Registry, "cdc_table_repairs_total", "table", "public.outbox") == 1
	})
	for id := range writeSeq(t, conn, "agg", 20, 15, 2) {
		want[id] = true
	}
	expectCommitOrder(t, e.kafka.NewConsumer(t, e.kafka.AllTopics()), want)
}

// TestFirstStartBackfillInCommitOrder: a first start's backfill without
// order_by (backfill: {}) of a table with 600 rows, 20 aggregates of 30
// events, one transaction each: sent in commit order, then the stream's.
// It sent them in the order of their uuids. A second table's backfill
// reads in the same snapshot's transaction, from a cursor of its own.
func TestFirstStartBackfillInCommitOrder(t *testing.T) {
	e := newEnv(t, testenv.NewKafka(t))
	conn := testenv.Connect(t, e.db)
	want := writeSeq(t, conn, "agg", 20, 0, 30)
	testenv.Exec(t, e.db, `CREATE TABLE outbox2 (LIKE outbox INCLUDING ALL)`,
		`INSERT INTO outbox2 (aggregatetype, aggregateid, type, payload) SELECT 'order', 'two-' || (i % 5), 'Seq', jsonb_build_object('agg', 'two-' || (i % 5), 'seq', i) FROM generate_series(1, 100) i`)
	var two []string
	testenv.QueryRow(t, e.db, `SELECT array_agg(id::text) FROM outbox2`, nil, &two)
	for _, id := range two {
		want[id] = true
	}
	e.cfg.Tables[0].Backfill = &outbox.BackfillOptions{ChunkSize: 50}
	second := *e.cfg.Tables[0]
	second.Name.Name = "outbox2"
	e.cfg.Tables = append(e.cfg.Tables, &second)
	e.start(t)
	for id := range writeSeq(t, conn, "agg", 20, 30, 2) {
		want[id] = true
	}
	expectCommitOrder(t, e.kafka.NewConsumer(t, e.kafka.AllTopics()), want)
}

// TestBackfillInCommitOrder: cdc backfill without order_by, beside the
// stream, of 600 rows the slot never streamed (committed before it, 20
// aggregates of 30 events): sent in commit order, once each.
func TestBackfillInCommitOrder(t *testing.T) {
	e := newEnv(t, testenv.NewKafka(t))
	conn := testenv.Connect(t, e.db)
	want := writeSeq(t, conn, "agg", 20, 0, 30)
	if err := e.start(t).stop(t); err != nil { // the slot, after the rows
		t.Fatal(err)
	}
	e.cfg.Tables[0].Backfill = &outbox.BackfillOptions{ChunkSize: 50}
	e.start(t)
	admin, err := pipeline.New(e.cfg, hclog.NewNullLogger(), pipeline.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	req, err := admin.Ops().RequestBackfill(ctx, e.cfg.Tables[0], "")
	if err != nil {
		t.Fatal(err)
	}
	job, err := admin.Ops().WatchBackfill(ctx, req, func(checkpoint.Job) {})
	if err != nil {
		t.Fatal(err)
	}
	if !job.Done() || job.Error != "" || job.Rows != int64(len(want)) {
		t.Fatalf("job %+v: want it done, with %d rows", job, len(want))
	}
	expectCommitOrder(t, e.kafka.NewConsumer(t, e.kafka.AllTopics()), want)
}

// TestFreshEventsAfterTheRepairsRows (issue 53, item 11): while the
// connector is stopped, the outbox is created again and receives
// aggregate agg-0's events 0 to 4 (and other aggregates'), and a
// transaction opens on another aggregate. The next start publishes the
// table, and the repair waits for that transaction; meanwhile agg-0's
// events 5 to 9 commit, after the table joined the publication: the
// stream carries them before the repair's message. The topic still reads
// agg-0 in commit order, 0 to 14: the stream waits at the first of them
// until the repair's snapshot is taken, sends the snapshot's rows there,
// and passes over the events the snapshot held. It sent 5 to 9 first. In
// both delivery modes (read read_committed in exactly-once mode).
//
// In exactly-once mode the stream waits at most half of
// exactly_once.transaction_timeout, which the open Kafka transaction
// cannot outlast: past it the session ends and the next waits again (the
// "long wait" case holds the transaction open past it), and still every
// event arrives once, in order.
func TestFreshEventsAfterTheRepairsRows(t *testing.T) {
	for _, tc := range []struct {
		name, mode string
		long       bool
	}{{config.DeliveryAtLeastOnce, config.DeliveryAtLeastOnce, false}, {config.DeliveryExactlyOnce, config.DeliveryExactlyOnce, false},
		{"exactly-once, a long wait", config.DeliveryExactlyOnce, true}} {
		t.Run(tc.name, func(t *testing.T) { freshEventsAfterTheRepairsRows(t, tc.mode, tc.long) })
	}
}

func freshEventsAfterTheRepairsRows(t *testing.T, mode string, long bool) {
	e := newEnv(t, testenv.NewKafka(t))
	e.cfg.Delivery = mode
	if long {
		e.cfg.ExactlyOnce.TransactionTimeout = 2 * time.Second
	}
	e.cfg.Postgres.CatalogCheckInterval = 5 * time.Minute // the watch looks at start, and when asked
	r := e.start(t)
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	testenv.Exec(t, e.db, recreateSQL)
	conn := testenv.Connect(t, e.db)
	want := writeSeq(t, conn, "agg", 10, 0, 5)
	ctx := context.Background()
	tx, err := testenv.Connect(t, e.db).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	var open string
	if err := tx.QueryRow(ctx, `INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('order', 'open', 'Seq', $1) RETURNING id::text`, seqPayload("open", 0)).Scan(&open); err != nil {
		t.Fatal(err)
	}
	want[open] = true
	r = e.start(t)
	testenv.Eventually(t, 30*time.Second, "the new table published", func() bool {
		var n int
		testenv.QueryRow(t, e.db, `SELECT count(*) FROM pg_publication_tables WHERE pubname = 'outbox_cdc' AND tablename = 'outbox'`, nil, &n)
		return n == 1
	})
	for id := range writeSeq(t, conn, "agg", 10, 5, 5) {
		want[id] = true
	}
	// They are in the WAL before the repair's message, which cannot be
	// written until tx ends.
	if long {
		testenv.Eventually(t, time.Minute, "a session to end on the wait", func() bool { return counterValue(r.p.Metrics().Restarts) >= 1 })
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	for id := range writeSeq(t, conn, "agg", 10, 10, 5) {
		want[id] = true
	}
	c := e.kafka.NewConsumer(t, e.kafka.AllTopics())
	if mode == config.DeliveryExactlyOnce {
		c = e.kafka.NewCommittedConsumer(t, e.kafka.AllTopics())
	}
	expectCommitOrder(t, c, want)
}

// TestRepairInCommitTimestampOrder: on a server with
// track_commit_timestamp on, the repair sends the recreated table's rows
// in the order of their commits' timestamps, which the transactions' ids
// do not give: for each of 10 aggregates, a transaction takes its id,
// another then writes the aggregate's event 0 and commits, and the first
// writes event 1 and commits; a third writes event 2, event 3 inside a
// savepoint (its own, later id) and event 4 after it. By transaction id
// the aggregate would read 1, 0, 2, 4, 3; by commit time it reads 0 to 4.
func TestRepairInCommitTimestampOrder(t *testing.T) {
	testenv.Require(t, pg)
	srv, err := testenv.StartPostgres("track_commit_timestamp=on") // its own: the setting is the server's
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	db := srv.NewDatabase(t)
	testenv.Exec(t, db, schema)
	kafka := testenv.NewKafka(t)
	e := &env{db: db, kafka: kafka, cfg: newEnvConfig(db, kafka)}
	var logs testenv.Buffer
	e.logOut, e.logLevel = &logs, hclog.Info
	r := e.start(t)
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	testenv.Exec(t, db, recreateSQL)
	ctx := context.Background()
	conn, early := testenv.Connect(t, db), testenv.Connect(t, db)
	want := map[string]bool{}
	for a := range 10 {
		agg := fmt.Sprintf("agg-%d", a)
		tx, err := early.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `SELECT pg_current_xact_id()`); err != nil {
			t.Fatal(err)
		}
		want[insertSeq(t, conn, agg, 0)] = true
		var id string
		if err := tx.QueryRow(ctx, `INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('order', $1, 'Seq', $2) RETURNING id::text`, agg, seqPayload(agg, 1)).Scan(&id); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		want[id] = true
		err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			for seq := 2; seq <= 4; seq++ {
				q := tx
				if seq == 3 {
					// A savepoint: the row's xmin is the savepoint's
					// own xid, above the transaction's.
					if q, err = tx.Begin(ctx); err != nil {
						return err
					}
				}
				if err := q.QueryRow(ctx, `INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('order', $1, 'Seq', $2) RETURNING id::text`, agg, seqPayload(agg, seq)).Scan(&id); err != nil {
					return err
				}
				want[id] = true
				if seq == 3 {
					if err := q.Commit(ctx); err != nil {
						return err
					}
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	e.start(t)
	expectCommitOrder(t, kafka.NewConsumer(t, kafka.AllTopics()), want)
	if !strings.Contains(logs.String(), "commit timestamps (track_commit_timestamp is on)") {
		t.Errorf("the log does not say the repair reads in commit-timestamp order:\n%s", logs.String())
	}
}
