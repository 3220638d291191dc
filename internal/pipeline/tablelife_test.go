package pipeline_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/config"
	"github.com/outboxcdc/cdc/internal/errtext"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/route"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// The outbox table's life (docs/operations.md, "The outbox table's life";
// docs/design.md, "Table changes"): partitions, migrations and a table
// dropped and recreated while the connector streams. Each test counts
// every event against the table's own rows.

// partitionedSchema is Debezium's layout partitioned by month, the layout
// pg_partman and outbox-retention guides recommend, with one month split
// again by hash (a partition of a partition).
const partitionedSchema = `
DROP TABLE outbox;
CREATE TABLE outbox (
  id uuid NOT NULL DEFAULT gen_random_uuid(),
  created_at timestamptz NOT NULL DEFAULT now(),
  aggregatetype text NOT NULL,
  aggregateid text NOT NULL,
  type text NOT NULL,
  payload jsonb,
  PRIMARY KEY (id, created_at)
) PARTITION BY RANGE (created_at);
CREATE TABLE outbox_2026_01 PARTITION OF outbox FOR VALUES FROM ('2026-01-01') TO ('2026-02-01');
CREATE TABLE outbox_2026_02 PARTITION OF outbox FOR VALUES FROM ('2026-02-01') TO ('2026-03-01')
  PARTITION BY HASH (id);
CREATE TABLE outbox_2026_02_h0 PARTITION OF outbox_2026_02 FOR VALUES WITH (MODULUS 2, REMAINDER 0);
CREATE TABLE outbox_2026_02_h1 PARTITION OF outbox_2026_02 FOR VALUES WITH (MODULUS 2, REMAINDER 1);
CREATE TABLE outbox_default PARTITION OF outbox DEFAULT;
`

// outboxRows is the table's rows, id → aggregate id, the ground truth.
func outboxRows(t *testing.T, db string) map[string]string {
	t.Helper()
	// Closed on return, not when the test ends: a test may call this in a
	// loop of looks, one connection each.
	conn := testenv.Connect(t, db)
	defer conn.Close(context.Background())
	rows, err := conn.Query(context.Background(), `SELECT id::text, aggregateid FROM outbox`)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for rows.Next() {
		var id, agg string
		if err := rows.Scan(&id, &agg); err != nil {
			t.Fatal(err)
		}
		m[id] = agg
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return m
}

// expectEvents waits until every id in want was delivered, then checks
// that each arrived exactly once (dups allowed up to maxDups in all), in
// the table's topic with its key, and nothing else arrived.
func expectEvents(t *testing.T, c *testenv.Consumer, want map[string]string, maxDups int) {
	t.Helper()
	waitForIDs(t, c, want)
	c.Settle(t)
	dups := 0
	for _, rec := range c.Records {
		id := testenv.Header(rec, route.HeaderID)
		agg, ok := want[id]
		if !ok {
			t.Errorf("record with id %q that the table does not hold (topic %s)", id, rec.Topic)
			continue
		}
		if string(rec.Key) != agg {
			t.Errorf("event %s key %q, want %q", id, rec.Key, agg)
		}
	}
	for id, n := range ids(c.Records) {
		if n > 1 {
			dups += n - 1
			if maxDups == 0 {
				t.Errorf("event %s delivered %d times", id, n)
				logCopies(t, c, id)
			}
		}
	}
	if dups > maxDups {
		t.Errorf("%d duplicates, want at most %d", dups, maxDups)
	}
}

// writer commits events one transaction at a time until stopped, each
// with a sequence number per aggregate, and returns how many it wrote.
type writer struct {
	stop    atomic.Bool
	n       atomic.Int64
	done    chan error
	lastErr error
}

func startWriter(t *testing.T, db, sql string) *writer {
	t.Helper()
	w := &writer{done: make(chan error, 1)}
	conn := testenv.Connect(t, db)
	go func() {
		ctx := context.Background()
		for i := 0; !w.stop.Load(); i++ {
			if _, err := conn.Exec(ctx, sql, fmt.Sprintf("w-%d", i%7), fmt.Sprintf(`{"seq": %d}`, i)); err != nil {
				// A migration can make an insert fail (the table is
				// locked, then gone for an instant): the writer's
				// transaction rolls back, as an application's would.
				if !strings.Contains(err.Error(), "does not exist") {
					w.done <- err
					return
				}
				continue
			}
			w.n.Add(1)
		}
		w.done <- nil
	}()
	return w
}

func (w *writer) finish(t *testing.T) int64 {
	t.Helper()
	w.stop.Store(true)
	select {
	case err := <-w.done:
		if err != nil {
			t.Fatalf("writer: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the writer did not stop")
	}
	return w.n.Load()
}

// waitWrites waits until the writer has written at least n more events.
func (w *writer) waitWrites(t *testing.T, n int64) {
	t.Helper()
	target := w.n.Load() + n
	testenv.Eventually(t, time.Minute, fmt.Sprintf("the writer to write %d more events", n), func() bool { return w.n.Load() >= target })
}

const insertSQL = `INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('order', $1, 'Created', $2)`

// TestPartitionedOutbox: a table partitioned by month, with a partition
// of a partition, streams every event under the configured root's name,
// and keeps doing so as partitions are attached, detached and dropped.
func TestPartitionedOutbox(t *testing.T) {
	e := newEnv(t, testenv.NewKafka(t))
	testenv.Exec(t, e.db, partitionedSchema)
	e.start(t)
	conn := testenv.Connect(t, e.db)
	ctx := context.Background()
	c := e.kafka.NewConsumer(t, e.kafka.AllTopics())

	write := func(month string, n int) {
		for i := 0; i < n; i++ {
			if _, err := conn.Exec(ctx, `INSERT INTO outbox (created_at, aggregatetype, aggregateid, type, payload) VALUES ($1, 'order', $2, 'Created', '{}')`,
				month+fmt.Sprintf("-%02d", 1+i%28), fmt.Sprintf("p-%d", i%5)); err != nil {
				t.Fatal(err)
			}
		}
	}
	write("2026-01", 100)
	write("2026-02", 100) // the hash sub-partitions
	write("2027-05", 100) // the default partition
	expectEvents(t, c, outboxRows(t, e.db), 0)
	for _, rec := range c.Records {
		if got := testenv.Header(rec, route.HeaderAggregateType); got != "order" || rec.Topic != e.kafka.Prefix+"outbox.event.order" {
			t.Fatalf("record in %s with aggregate type %q", rec.Topic, got)
		}
	}

	// Partitions attached, detached and dropped while streaming.
	testenv.Exec(t, e.db,
		`CREATE TABLE outbox_2026_03 (LIKE outbox INCLUDING DEFAULTS)`,
		`ALTER TABLE outbox_2026_03 ADD PRIMARY KEY (id, created_at)`,
		`ALTER TABLE outbox DETACH PARTITION outbox_default`,
		`ALTER TABLE outbox ATTACH PARTITION outbox_2026_03 FOR VALUES FROM ('2026-03-01') TO ('2026-04-01')`,
		`DROP TABLE outbox_2026_01`)
	write("2026-03", 50)
	write("2026-02", 50)
	// A row of the detached table is no outbox event any more; PostgreSQL
	// 14 may still publish one inserted right after the detach under the
	// root (its relation cache), so it is allowed, not required.
	var detached string
	testenv.QueryRow(t, e.db, `INSERT INTO outbox_default (created_at, aggregatetype, aggregateid, type) VALUES ('2030-01-01', 'order', 'detached', 'X') RETURNING id::text`, nil, &detached)
	want := outboxRows(t, e.db)
	delete(want, detached)
	for _, rec := range c.Records {
		id := testenv.Header(rec, route.HeaderID)
		if _, ok := want[id]; !ok {
			want[id] = string(rec.Key) // delivered before its partition was dropped or detached
		}
	}
	if len(want) != 400 {
		t.Fatalf("%d events in the ground truth, want 400", len(want))
	}
	c.WaitFor(t, 2*time.Minute, "400 events", func(recs []*kgo.Record) bool {
		got := ids(recs)
		for id := range want {
			if got[id] == 0 {
				return false
			}
		}
		return true
	})
	c.Settle(t)
	for id, n := range ids(c.Records) {
		if _, ok := want[id]; (!ok && id != detached) || n > 1 {
			t.Errorf("event %s delivered %d times (in the table: %v)", id, n, ok)
		}
	}
}

// TestPartitionedOutboxBackfill: a first start's backfill of a
// partitioned table reads every partition, and the rows committed after
// the slot stream, each once.
func TestPartitionedOutboxBackfill(t *testing.T) {
	e := newEnv(t, testenv.NewKafka(t))
	testenv.Exec(t, e.db, partitionedSchema)
	testenv.Exec(t, e.db, `INSERT INTO outbox (created_at, aggregatetype, aggregateid, type, payload)
		SELECT '2026-01-01'::timestamptz + (i % 80) * interval '1 day', 'order', 'b-' || (i % 9), 'Pending', '{}' FROM generate_series(1, 200) i`)
	e.cfg.Tables[0].Backfill = &outbox.BackfillOptions{ChunkSize: 50}
	e.start(t)
	conn := testenv.Connect(t, e.db)
	for i := 0; i < 20; i++ {
		insertEvent(t, conn, "after", "Created")
	}
	expectEvents(t, e.kafka.NewConsumer(t, e.kafka.AllTopics()), outboxRows(t, e.db), 0)
}

// TestPartitionedOutboxOtherPublication: a publication made by someone
// else for a partitioned table, without publish_via_partition_root,
// names the leaf partitions: the connector, which may not change it,
// refuses to start with the statement to run, and once it was run, sends
// every event, those committed while the publication named the leaves
// included.
func TestPartitionedOutboxOtherPublication(t *testing.T) {
	e := newEnv(t, testenv.NewKafka(t))
	testenv.Exec(t, e.db, partitionedSchema)
	e.cfg.Postgres.URL = testenv.LeastPrivileged(t, e.db, "outbox", true)
	r := e.launch(t, discard{})
	err := waitFatal(t, r)
	want := `ALTER PUBLICATION outbox_cdc SET (publish_via_partition_root = true)`
	if !errors.As(err, new(*errtext.Fatal)) || !strings.Contains(err.Error(), want) {
		t.Fatalf("got %v, want a setup error that says: %s", err, want)
	}

	// Streamed from a slot made while the publication named the leaves.
	testenv.Exec(t, e.db, `SELECT pg_create_logical_replication_slot('outbox_cdc', 'pgoutput')`)
	conn := testenv.Connect(t, e.db)
	for i := 0; i < 30; i++ {
		insertEvent(t, conn, fmt.Sprintf("leaf-%d", i%3), "Created")
	}
	testenv.Exec(t, e.db, want)
	for i := 0; i < 30; i++ {
		insertEvent(t, conn, fmt.Sprintf("root-%d", i%3), "Created")
	}
	e.start(t)
	expectEvents(t, e.kafka.NewConsumer(t, e.kafka.AllTopics()), outboxRows(t, e.db), 0)
}

// recreateSQL drops and recreates the outbox table in one transaction,
// as a migration tool does.
const recreateSQL = `BEGIN;
DROP TABLE outbox;
CREATE TABLE outbox (
  id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
  aggregatetype text NOT NULL,
  aggregateid text NOT NULL,
  type text NOT NULL,
  payload jsonb
);
COMMIT;`

// TestRecreatedOutbox: a migration drops and recreates the outbox table
// while a writer commits and the connector streams, in both delivery
// modes. The connector, which created the publication, adds the new table
// back and sends what it received before: every event arrives, once (read
// read_committed in exactly-once mode).
func TestRecreatedOutbox(t *testing.T) {
	for _, mode := range []string{config.DeliveryAtLeastOnce, config.DeliveryExactlyOnce} {
		t.Run(mode, func(t *testing.T) {
			kafka := testenv.NewKafka(t)
			e := newEnv(t, kafka)
			e.cfg.Delivery = mode
			e.start(t)
			c := kafka.NewConsumer(t, kafka.AllTopics())
			if mode == config.DeliveryExactlyOnce {
				c = kafka.NewCommittedConsumer(t, kafka.AllTopics())
			}
			w := startWriter(t, e.db, insertSQL)
			w.waitWrites(t, 50)
			want := outboxRows(t, e.db)
			testenv.Exec(t, e.db, recreateSQL)
			// Detected within catalog_check_interval (5 s by default).
			w.waitWrites(t, 100)
			w.finish(t)
			for id, agg := range outboxRows(t, e.db) {
				want[id] = agg
			}
			expectRecreated(t, c, want, int(w.n.Load()))
		})
	}
}

// TestRecreatedOutboxLeastPrivileged: the least-privileged role may not
// add the recreated table to the publication (nor read it): the connector
// stops with the statements to run, naming the table, and once the
// owner ran them and the connector started again, every event arrives
// once: those the new table received before it was published, and
// after.
func TestRecreatedOutboxLeastPrivileged(t *testing.T) {
	e := newEnv(t, testenv.NewKafka(t))
	e.cfg.Postgres.URL = testenv.LeastPrivileged(t, e.db, "outbox", true)
	e.cfg.Postgres.CatalogCheckInterval = 100 * time.Millisecond
	r := e.start(t)
	c := e.kafka.NewConsumer(t, e.kafka.AllTopics())
	w := startWriter(t, e.db, insertSQL)
	w.waitWrites(t, 50)
	before := outboxRows(t, e.db)
	testenv.Exec(t, e.db, recreateSQL)
	err := waitFatal(t, r)
	var role string
	testenv.QueryRow(t, e.cfg.Postgres.URL, `SELECT current_user`, nil, &role)
	add, grant := "ALTER PUBLICATION outbox_cdc ADD TABLE ONLY public.outbox", "GRANT SELECT ON public.outbox TO "+role
	if !errors.As(err, new(*errtext.Fatal)) || !strings.Contains(err.Error(), add) || !strings.Contains(err.Error(), grant) {
		t.Fatalf("got %v; want a setup error that says to run %q and %q", err, add, grant)
	}
	w.waitWrites(t, 50) // while the connector is stopped, and the table unpublished
	testenv.Exec(t, e.db, add, grant)
	w.waitWrites(t, 50) // published, the connector still stopped
	e.start(t)
	w.waitWrites(t, 50)
	w.finish(t)
	want := outboxRows(t, e.db)
	for id, agg := range before {
		want[id] = agg
	}
	expectRecreated(t, c, want, int(w.n.Load()))
}

// expectRecreated checks a run in which the outbox table was recreated:
// want holds every row of the new table and those of the old one the
// test saw; every event written (total) arrives once, and each
// aggregate's events with a sequence number (the writer's: one
// connection, so in commit order) arrive in its order, across the
// repair's point too.
func expectRecreated(t *testing.T, c *testenv.Consumer, want map[string]string, total int) {
	t.Helper()
	c.WaitFor(t, 2*time.Minute, fmt.Sprintf("all %d events written", total), func(recs []*kgo.Record) bool { return len(ids(recs)) >= total })
	c.Settle(t)
	got := ids(c.Records)
	for id := range want {
		if got[id] == 0 {
			t.Errorf("event %s never arrived", id)
		}
	}
	if len(got) != total {
		t.Errorf("%d distinct events delivered, %d written", len(got), total)
	}
	for id, n := range got {
		if n > 1 {
			t.Errorf("event %s delivered %d times", id, n)
			logCopies(t, c, id)
		}
	}
	last, reordered := map[string]int{}, 0
	for _, rec := range c.Records {
		var ev struct {
			Seq *int `json:"seq"`
		}
		if json.Unmarshal(rec.Value, &ev) != nil || ev.Seq == nil {
			continue
		}
		agg := string(rec.Key)
		if prev, ok := last[agg]; ok && *ev.Seq <= prev {
			if reordered++; reordered <= 5 {
				t.Errorf("%s: seq %d arrived after seq %d", agg, *ev.Seq, prev)
			}
		}
		last[agg] = *ev.Seq
	}
	if reordered > 0 {
		t.Errorf("%d events arrived after a later one of their aggregate", reordered)
	}
}

// logCopies logs where each copy of a duplicated event landed, and from
// which commit: a copy sent again by a restart and one the stream sent
// twice look different.
func logCopies(t *testing.T, c *testenv.Consumer, id string) {
	t.Helper()
	for _, r := range c.Records {
		if testenv.Header(r, route.HeaderID) == id {
			t.Logf("  a copy at %s[%d]@%d, commit lsn %s", r.Topic, r.Partition, r.Offset, testenv.Header(r, route.HeaderCommitLSN))
		}
	}
}

// TestRecreatedWhileStopped: the table is recreated while the connector is
// stopped, and the new one receives 3,000 events, more than max_in_flight:
// the next start publishes it (the connector created the publication) and
// sends them, each once, in batches it waits on (a repair that waited on
// its first batch without letting it go once hung here).
func TestRecreatedWhileStopped(t *testing.T) {
	e := newEnv(t, testenv.NewKafka(t))
	e.cfg.MaxInFlight = 256
	r := e.start(t)
	c := e.kafka.NewConsumer(t, e.kafka.AllTopics())
	conn := testenv.Connect(t, e.db)
	for i := 0; i < 20; i++ {
		insertEvent(t, conn, "old", "Created")
	}
	want := outboxRows(t, e.db)
	c.WaitCount(t, time.Minute, 20)
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	testenv.Exec(t, e.db, recreateSQL)
	testenv.Exec(t, e.db, `INSERT INTO outbox (aggregatetype, aggregateid, type, payload) SELECT 'order', 'new-' || (i % 10), 'Created', '{}' FROM generate_series(1, 3000) i`)
	e.start(t)
	for i := 0; i < 10; i++ {
		insertEvent(t, conn, "after", "Created")
	}
	for id, agg := range outboxRows(t, e.db) {
		want[id] = agg
	}
	expectRecreated(t, c, want, 3030)
}

// TestTableLeftPublication: the table streamed before is removed from the
// publication while the connector runs: its rows inserted meanwhile
// cannot be told from those sent before, so the connector stops with the
// statements to run, and refuses to start until they ran.
func TestTableLeftPublication(t *testing.T) {
	e := newEnv(t, testenv.NewKafka(t))
	e.cfg.Postgres.CatalogCheckInterval = 100 * time.Millisecond
	r := e.start(t)
	testenv.Exec(t, e.db, `ALTER PUBLICATION outbox_cdc DROP TABLE outbox`)
	err := waitFatal(t, r)
	want := "outbox table public.outbox left publication outbox_cdc (someone removed it)"
	if !errors.As(err, new(*errtext.Fatal)) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "ALTER PUBLICATION outbox_cdc ADD TABLE ONLY public.outbox") {
		t.Fatalf("got %v, want a setup error that says %q and the statement", err, want)
	}
	err = waitFatal(t, e.launch(t, discard{}))
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("a start with the table out of the publication: %v, want a refusal", err)
	}
}

// TestMigrationsThatHold: the migrations a team runs on a live outbox
// lose nothing, while a writer commits: a column added with a default, a
// column's type widened, an unmapped column dropped; and events inserted
// and deleted in one transaction (Debezium's advice for keeping the table
// empty), and a TRUNCATE, still deliver every committed insert.
func TestMigrationsThatHold(t *testing.T) {
	e := newEnv(t, testenv.NewKafka(t))
	testenv.Exec(t, e.db, `ALTER TABLE outbox ADD COLUMN note varchar(10), ADD COLUMN seq int`)
	e.start(t)
	c := e.kafka.NewConsumer(t, e.kafka.AllTopics())
	w := startWriter(t, e.db, insertSQL)
	var written []string
	keep := func() {
		for id := range outboxRows(t, e.db) {
			written = append(written, id)
		}
	}
	for _, ddl := range []string{
		`ALTER TABLE outbox ADD COLUMN tenant text NOT NULL DEFAULT 'acme'`,
		`ALTER TABLE outbox ALTER COLUMN note TYPE varchar(200)`,
		`ALTER TABLE outbox ALTER COLUMN seq TYPE bigint`,
		`ALTER TABLE outbox DROP COLUMN note`,
	} {
		w.waitWrites(t, 30)
		testenv.Exec(t, e.db, ddl)
	}
	w.waitWrites(t, 30)
	w.finish(t)
	keep()

	// Inserted and deleted in the same transaction: the INSERT is in the
	// WAL, and the event is delivered.
	conn := testenv.Connect(t, e.db)
	ctx := context.Background()
	for i := 0; i < 10; i++ {
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			var id string
			if err := tx.QueryRow(ctx, `INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('order', 'del', 'Created', '{}') RETURNING id::text`).Scan(&id); err != nil {
				return err
			}
			written = append(written, id)
			_, err := tx.Exec(ctx, `DELETE FROM outbox WHERE id = $1`, id)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	// A TRUNCATE while streaming: what was inserted before it is
	// delivered, and the stream goes on.
	for i := 0; i < 10; i++ {
		written = append(written, insertEvent(t, conn, "trunc", "Created"))
	}
	testenv.Exec(t, e.db, `TRUNCATE outbox`)
	for i := 0; i < 10; i++ {
		written = append(written, insertEvent(t, conn, "after-truncate", "Created"))
	}
	total := int(w.n.Load()) + 30
	if len(written) != total {
		t.Fatalf("%d ids kept, %d written", len(written), total)
	}
	c.WaitFor(t, 2*time.Minute, fmt.Sprintf("%d events", total), func(recs []*kgo.Record) bool { return len(ids(recs)) >= total })
	c.SettleConfirmed(t, time.Minute, e.db, "outbox_cdc")
	got := ids(c.Records)
	for _, id := range written {
		if got[id] != 1 {
			t.Errorf("event %s delivered %d times, want once", id, got[id])
		}
	}
	if len(got) != total {
		t.Errorf("%d distinct events, want %d", len(got), total)
	}
}

// TestMappedColumnDropped: dropping a column the config maps, while
// streaming, stops the connector with an error naming it, and nothing past
// that event is confirmed: the slot still holds the insert.
func TestMappedColumnDropped(t *testing.T) {
	e := newEnv(t, testenv.NewKafka(t))
	r := e.start(t)
	c := e.kafka.NewConsumer(t, e.kafka.AllTopics())
	conn := testenv.Connect(t, e.db)
	insertEvent(t, conn, "a-1", "Created")
	c.WaitCount(t, time.Minute, 1)
	testenv.Exec(t, e.db, `ALTER TABLE outbox DROP COLUMN aggregateid`)
	var id string
	if err := conn.QueryRow(context.Background(), `INSERT INTO outbox (aggregatetype, type, payload) VALUES ('order', 'AfterDrop', '{}') RETURNING id::text`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	err := waitFatal(t, r)
	if err == nil || !strings.Contains(err.Error(), "has no column aggregateid") || !strings.Contains(err.Error(), "renamed or dropped") {
		t.Fatalf("got %v, want a stop naming the column", err)
	}
	if !testenv.Pending(t, e.db, "outbox_cdc", "outbox_cdc", id) {
		t.Fatal("the slot was confirmed past the event after the drop")
	}
}

// TestUnmappedRelation: a publication that carries another table's inserts
// too (made by someone else) is reported: each insert counted by relation,
// not an event, and the outbox streams on.
func TestUnmappedRelation(t *testing.T) {
	e := newEnv(t, testenv.NewKafka(t))
	testenv.Exec(t, e.db, `CREATE PUBLICATION outbox_cdc FOR TABLE outbox, other WITH (publish = 'insert')`)
	r := e.start(t)
	c := e.kafka.NewConsumer(t, e.kafka.AllTopics())
	conn := testenv.Connect(t, e.db)
	for i := 0; i < 5; i++ {
		testenv.Exec(t, e.db, `INSERT INTO other (note) VALUES ('x')`)
		insertEvent(t, conn, "a", "Created")
	}
	expectEvents(t, c, outboxRows(t, e.db), 0)
	testenv.Eventually(t, time.Minute, "the unmapped inserts counted", func() bool {
		return testenv.Counter(t, r.p.Metrics().Registry, "cdc_unmapped_relation_changes_total", "relation", "public.other") == 5
	})
}

// TestTableMissing: a table dropped (not recreated) is reported as missing,
// and the connector streams on; created again, it is published and its
// rows are sent.
func TestTableMissing(t *testing.T) {
	e := newEnv(t, testenv.NewKafka(t))
	e.cfg.Postgres.CatalogCheckInterval = 100 * time.Millisecond
	r := e.start(t)
	c := e.kafka.NewConsumer(t, e.kafka.AllTopics())
	testenv.Exec(t, e.db, `DROP TABLE outbox`)
	missing := func() float64 {
		return testenv.Counter(t, r.p.Metrics().Registry, "cdc_table_missing", "table", "public.outbox")
	}
	testenv.Eventually(t, time.Minute, "the table reported missing", func() bool { return missing() == 1 })
	create := strings.TrimSuffix(strings.TrimPrefix(recreateSQL, "BEGIN;\nDROP TABLE outbox;"), "COMMIT;")
	testenv.Exec(t, e.db, create[strings.Index(create, "CREATE"):])
	conn := testenv.Connect(t, e.db)
	for i := 0; i < 10; i++ {
		insertEvent(t, conn, "back", "Created")
	}
	expectEvents(t, c, outboxRows(t, e.db), 0)
	if missing() != 0 {
		t.Fatal("still reported missing")
	}
	if n := testenv.Counter(t, r.p.Metrics().Registry, "cdc_table_repairs_total", "table", "public.outbox"); n != 1 {
		t.Fatalf("%v repairs counted, want 1", n)
	}
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
