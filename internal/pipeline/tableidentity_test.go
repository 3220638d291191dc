package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/errtext"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/route"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// A table is followed by its identity, not its name (docs/design.md,
// "Table changes"; issue 47): renames, swaps, leaf partitions detached
// before the stream reached their rows, and a transaction open across the
// repair of a recreated table. Each test counts every event against the
// rows written.

// rowsOf is table's rows, id → aggregate id.
func rowsOf(t *testing.T, db, table string) map[string]string {
	t.Helper()
	// Closed on return, not when the test ends: a test may call this in a
	// loop of looks, one connection each.
	conn := testenv.Connect(t, db)
	defer conn.Close(context.Background())
	rows, err := conn.Query(context.Background(), `SELECT id::text, aggregateid FROM `+table)
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
	return m
}

// TestRenamedOutboxStreamsOn: the outbox table is renamed while the
// connector streams and the application writes to the new name. The
// connector follows the relation, says so (cdc_table_renamed, an error
// in the log), and every event arrives, those written under the new name
// included; today's code called them unmapped and confirmed past them.
// A restart with the old name keeps following it (a standby, a pod
// restarted, does not stop), and one with the new name streams on from
// the checkpoint: the events written while the connector was stopped
// arrive, and none twice. A name that is nobody's, with a relation the
// checkpoint does not know, stops the start.
func TestRenamedOutboxStreamsOn(t *testing.T) {
	e := newEnv(t, testenv.NewKafka(t))
	e.cfg.Postgres.CatalogCheckInterval = 100 * time.Millisecond
	r := e.start(t)
	c := e.kafka.NewConsumer(t, e.kafka.AllTopics())
	conn := testenv.Connect(t, e.db)
	for i := 0; i < 20; i++ {
		insertEvent(t, conn, fmt.Sprintf("before-%d", i%3), "Created")
	}
	testenv.Exec(t, e.db, `ALTER TABLE outbox RENAME TO outbox_v2`)
	write := func(n int, agg string) {
		for i := 0; i < n; i++ {
			testenv.Exec(t, e.db, fmt.Sprintf(`INSERT INTO outbox_v2 (aggregatetype, aggregateid, type, payload) VALUES ('order', '%s-%d', 'Created', '{}')`, agg, i%3))
		}
	}
	write(100, "renamed")
	expectEvents(t, c, rowsOf(t, e.db, "outbox_v2"), 0)
	testenv.Eventually(t, time.Minute, "the rename reported", func() bool {
		return testenv.Counter(t, r.p.Metrics().Registry, "cdc_table_renamed", "table", "public.outbox") == 1
	})
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	write(30, "stopped")
	r = e.start(t)
	write(10, "old-name")
	expectEvents(t, c, rowsOf(t, e.db, "outbox_v2"), 0)
	if got := testenv.Counter(t, r.p.Metrics().Registry, "cdc_table_renamed", "table", "public.outbox"); got != 1 {
		t.Fatalf("cdc_table_renamed %v after a start with the old name, want 1", got)
	}
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	write(30, "stopped-again")
	e.cfg.Tables[0].Name = outbox.TableName{Schema: "public", Name: "outbox_v2"}
	e.start(t)
	write(20, "after")
	expectEvents(t, c, rowsOf(t, e.db, "outbox_v2"), 0)

	other := newEnv(t, e.kafka)
	other.cfg.Tables[0].Name = outbox.TableName{Schema: "public", Name: "nobody"}
	err := waitFatal(t, other.launch(t, discard{}))
	if !errors.As(err, new(*errtext.Fatal)) || !strings.Contains(err.Error(), "outbox table public.nobody does not exist") {
		t.Fatalf("a start with a table that does not exist: %v; want a stop that says so", err)
	}
}

// TestSwappedOutbox: a migration swaps the outbox for a new table (the old
// one renamed away, a new one created under the name) while the
// application writes. The new table is published and repaired; the old
// one, still written to by a straggler, stays the table's: every event of
// both arrives once.
func TestSwappedOutbox(t *testing.T) {
	e := newEnv(t, testenv.NewKafka(t))
	e.cfg.Postgres.CatalogCheckInterval = 100 * time.Millisecond
	e.start(t)
	c := e.kafka.NewConsumer(t, e.kafka.AllTopics())
	w := startWriter(t, e.db, insertSQL)
	w.waitWrites(t, 50)
	testenv.Exec(t, e.db, `BEGIN; ALTER TABLE outbox RENAME TO outbox_old;
		CREATE TABLE outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregatetype text NOT NULL, aggregateid text NOT NULL, type text NOT NULL, payload jsonb); COMMIT`)
	w.waitWrites(t, 100)
	for i := 0; i < 10; i++ { // a straggler still writing the old table
		testenv.Exec(t, e.db, `INSERT INTO outbox_old (aggregatetype, aggregateid, type, payload) VALUES ('order', 'straggler', 'Late', '{}')`)
	}
	w.waitWrites(t, 50)
	total := w.finish(t) + 10
	want := rowsOf(t, e.db, "outbox")
	for id, agg := range rowsOf(t, e.db, "outbox_old") {
		want[id] = agg
	}
	if int64(len(want)) != total {
		t.Fatalf("%d rows in the two tables, %d written", len(want), total)
	}
	expectEvents(t, c, want, 0)
}

// TestRepairWaitsForOpenTransaction: while the connector is stopped, the
// outbox is dropped and created again and a transaction inserts into the
// new table; the next start adds the table to the publication while that
// transaction is still open, and it commits only afterwards, with a
// second insert. PostgreSQL decodes the first insert with the catalog as
// of its position, where the table was not published, so only the
// repair can send it: the repair's snapshot must wait for the
// transaction. Every event arrives, once (the first insert was lost).
func TestRepairWaitsForOpenTransaction(t *testing.T) {
	e := newEnv(t, testenv.NewKafka(t))
	e.cfg.Postgres.CatalogCheckInterval = 5 * time.Minute // the watch looks at start only
	r := e.start(t)
	c := e.kafka.NewConsumer(t, e.kafka.AllTopics())
	conn := testenv.Connect(t, e.db)
	for i := 0; i < 10; i++ {
		insertEvent(t, conn, "old", "Created")
	}
	want := outboxRows(t, e.db)
	c.WaitCount(t, time.Minute, 10)
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	testenv.Exec(t, e.db, recreateSQL)
	ctx := context.Background()
	tx, err := testenv.Connect(t, e.db).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	var first string
	if err := tx.QueryRow(ctx, `INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('order', 'open', 'BeforePublished', '{}') RETURNING id::text`).Scan(&first); err != nil {
		t.Fatal(err)
	}
	e.start(t)
	testenv.Eventually(t, 30*time.Second, "the new table published", func() bool {
		var n int
		testenv.QueryRow(t, e.db, `SELECT count(*) FROM pg_publication_tables WHERE pubname = 'outbox_cdc' AND tablename = 'outbox'`, nil, &n)
		return n == 1
	})
	if _, err := tx.Exec(ctx, `INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('order', 'open', 'AfterPublished', '{}')`); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	insertEvent(t, conn, "later", "Created")
	for id, agg := range outboxRows(t, e.db) {
		want[id] = agg
	}
	if _, ok := want[first]; !ok || len(want) != 13 {
		t.Fatalf("%d rows written, want 13 with %s", len(want), first)
	}
	expectEvents(t, c, want, 0)
}

// TestLeafNamedAfterDetach: the publication stops publishing partitions
// via their root while the connector streams (someone turned
// publish_via_partition_root off), a row goes into a leaf partition, and
// that partition is detached before the stream reaches the row (Kafka
// holds the stream back). The leaf was found as the table's while it was
// attached, so the row is still the table's event: it arrives (it was
// dropped as unmapped). The connector sets the option back.
func TestLeafNamedAfterDetach(t *testing.T) {
	kafka := testenv.NewFakeKafka(t)
	e := newEnv(t, kafka)
	e.cfg.Postgres.CatalogCheckInterval = 100 * time.Millisecond
	e.cfg.MaxInFlight = 4
	testenv.Exec(t, e.db, partitionedSchema)
	block := blockEvents(t, kafka, e.cfg.Checkpoint.Topic)
	e.start(t)
	c := kafka.NewConsumer(t, kafka.AllTopics())
	conn := testenv.Connect(t, e.db)
	ctx := context.Background()
	insert := func(month, agg string) string {
		var id string
		if err := conn.QueryRow(ctx, `INSERT INTO outbox (created_at, aggregatetype, aggregateid, type, payload) VALUES ($1, 'order', $2, 'E', '{}') RETURNING id::text`, month, agg).Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	block.on()
	var want []string
	for i := 0; i < 8; i++ { // more than max_in_flight: the stream stops reading
		want = append(want, insert("2027-05-01", "held"))
	}
	testenv.Exec(t, e.db, `ALTER PUBLICATION outbox_cdc SET (publish_via_partition_root = false)`)
	want = append(want, insert("2026-01-15", "leaf"))
	// The watch sees the leaves (and sets the option back) before the
	// partition goes.
	testenv.Eventually(t, time.Minute, "publish_via_partition_root set back", func() bool {
		var on bool
		testenv.QueryRow(t, e.db, `SELECT pubviaroot FROM pg_publication WHERE pubname = 'outbox_cdc'`, nil, &on)
		return on
	})
	testenv.Exec(t, e.db, `ALTER TABLE outbox DETACH PARTITION outbox_2026_01`)
	want = append(want, insert("2027-06-01", "after"))
	block.off()
	c.WaitFor(t, time.Minute, fmt.Sprintf("%d events", len(want)), func(recs []*kgo.Record) bool {
		got := ids(recs)
		for _, id := range want {
			if got[id] == 0 {
				return false
			}
		}
		return true
	})
}

// TestRetentionKeepsRecreatedTable: retention with after 1s beside a
// table dropped and created again, which the watch finds only after its
// catalog_check_interval: the 200 rows the new table received meanwhile
// are not streamed (the new table is not published), and keepalives move
// the confirmed position past them. None of them leaves the table before
// its event arrived (all 200 were deleted unsent), and afterwards they go.
func TestRetentionKeepsRecreatedTable(t *testing.T) {
	e := newEnv(t, testenv.NewKafka(t))
	e.cfg.Postgres.CatalogCheckInterval = 8 * time.Second
	e.cfg.Tables[0].Retention = &outbox.Retention{After: time.Second}
	e.retentionInterval = 200 * time.Millisecond
	r := e.start(t)
	c := e.kafka.NewConsumer(t, e.kafka.AllTopics())
	// After the watch's first look: the next is catalog_check_interval on.
	testenv.Eventually(t, time.Minute, "the watch's first look", func() bool {
		return testenv.Value(t, r.p.Metrics().Registry, "cdc_catalog_checked_timestamp_seconds") > 0
	})
	testenv.Exec(t, e.db, recreateSQL)
	testenv.Exec(t, e.db, `INSERT INTO outbox (aggregatetype, aggregateid, type, payload) SELECT 'order', 'r-' || (i % 7), 'Created', '{}' FROM generate_series(1, 200) i`)
	inserted := time.Now()
	want := outboxRows(t, e.db)
	// Until two sweeps have run that began once the rows were older than
	// retention.after (the gauge is in whole seconds): a retention that
	// took the unpublished rows for delivered would have deleted them.
	// Each look reads Kafka to its end before it reads the table, and
	// again after it, before calling a row gone: a row deleted between
	// the two was delivered first.
	oldEnough := float64(inserted.Add(e.cfg.Tables[0].Retention.After).Unix() + 1)
	var swept []float64
	testenv.Eventually(t, time.Minute, "two sweeps once the rows were older than retention.after", func() bool {
		c.Settle(t)
		inTable := outboxRows(t, e.db)
		for id := range want {
			if inTable[id] == "" && ids(c.Records)[id] == 0 {
				c.Settle(t)
				if ids(c.Records)[id] == 0 {
					t.Fatalf("row %s left the table before its event arrived (%v deleted)", id,
						testenv.Counter(t, r.p.Metrics().Registry, "cdc_retention_rows_deleted_total", "table", "public.outbox"))
				}
			}
		}
		if at := testenv.Counter(t, r.p.Metrics().Registry, "cdc_retention_last_run_timestamp_seconds", "table", "public.outbox"); at >= oldEnough && !slices.Contains(swept, at) {
			swept = append(swept, at)
		}
		time.Sleep(100 * time.Millisecond) // the interval between looks, each a connection: the sweeps run on their own
		return len(swept) >= 2
	})
	expectEvents(t, c, want, 0)
	testenv.Eventually(t, time.Minute, "the repaired table's delivered rows deleted", func() bool {
		var n int
		testenv.QueryRow(t, e.db, `SELECT count(*) FROM outbox`, nil, &n)
		return n == 0
	})
}

// TestRetentionAtProductionSettings: retention.after 24h, the docs'
// example. With a clock moved a day on, the rows written and delivered
// before are deleted (marks were kept by count, at most about 4 hours'
// worth, so nothing ever was), and drop_partitions drops January's and
// February's partitions of a table partitioned by month at once, their
// rows delivered (a partition's age is its range's bound, not a mark's).
func TestRetentionAtProductionSettings(t *testing.T) {
	t.Run("delete", func(t *testing.T) {
		e := newEnv(t, testenv.NewKafka(t))
		e.cfg.Tables[0].Retention = &outbox.Retention{After: 24 * time.Hour}
		var ahead atomic.Int64
		e.clock = func() time.Time { return time.Now().Add(time.Duration(ahead.Load())) }
		e.retentionInterval = 100 * time.Millisecond
		r := e.start(t)
		conn := testenv.Connect(t, e.db)
		for i := 0; i < 50; i++ {
			insertEvent(t, conn, fmt.Sprintf("d-%d", i%5), "E")
		}
		expectEvents(t, e.kafka.NewConsumer(t, e.kafka.AllTopics()), outboxRows(t, e.db), 0)
		// Confirmed (the checkpoint, which retention reads, leads the
		// slot), then a sweep: without the first, one could see the
		// rows as unconfirmed and keep them for that.
		end := testenv.CurrentWAL(t, e.db)
		testenv.Eventually(t, time.Minute, "the slot to confirm the events", func() bool { return testenv.SlotPosition(t, e.db, "outbox_cdc") >= end })
		delivered := time.Now()
		deleted := func() float64 {
			return testenv.Counter(t, r.p.Metrics().Registry, "cdc_retention_rows_deleted_total", "table", "public.outbox")
		}
		// A sweep that began after that (the gauge is in whole seconds).
		testenv.Eventually(t, time.Minute, "a sweep after the events were delivered", func() bool {
			return testenv.Counter(t, r.p.Metrics().Registry, "cdc_retention_last_run_timestamp_seconds", "table", "public.outbox") > float64(delivered.Unix())
		})
		if n := deleted(); n != 0 {
			t.Fatalf("%v rows deleted before they were 24 h old", n)
		}
		ahead.Store(int64(24*time.Hour + time.Minute))
		testenv.Eventually(t, 30*time.Second, "the day-old rows deleted", func() bool {
			var n int
			testenv.QueryRow(t, e.db, `SELECT count(*) FROM outbox`, nil, &n)
			// The counter moves once the DELETE committed, after this
			// connection may see the table empty.
			return n == 0 && deleted() >= 50
		})
		if n := deleted(); n != 50 {
			t.Errorf("%v rows counted as deleted, want 50", n)
		}
	})
	t.Run("drop_partitions", func(t *testing.T) {
		e := newEnv(t, testenv.NewKafka(t))
		testenv.Exec(t, e.db, `DROP TABLE outbox`, partitionedByTime,
			`CREATE TABLE outbox_2026_01 PARTITION OF outbox FOR VALUES FROM ('2026-01-01') TO ('2026-02-01')`,
			`CREATE TABLE outbox_2026_02 PARTITION OF outbox FOR VALUES FROM ('2026-02-01') TO ('2026-03-01')`,
			`CREATE TABLE outbox_default PARTITION OF outbox DEFAULT`)
		e.cfg.Tables[0].Retention = &outbox.Retention{After: 24 * time.Hour, Mode: outbox.RetentionDropPartitions}
		e.retentionInterval = 100 * time.Millisecond
		e.start(t)
		conn := testenv.Connect(t, e.db)
		for _, month := range []string{"2026-01-10", "2026-02-10", "2099-01-01"} {
			if _, err := conn.Exec(context.Background(), `INSERT INTO outbox (created_at, aggregatetype, aggregateid, type, payload) VALUES ($1, 'order', 'p', 'E', '{}')`, month); err != nil {
				t.Fatal(err)
			}
		}
		expectEvents(t, e.kafka.NewConsumer(t, e.kafka.AllTopics()), outboxRows(t, e.db), 0)
		testenv.Eventually(t, 30*time.Second, "January's and February's partitions dropped", func() bool {
			got := partitions(t, e.db)
			return !got["outbox_2026_01"] && !got["outbox_2026_02"] && got["outbox_default"]
		})
	})
}

// TestRetentionKeepsAttachedRows: a table with 20 rows is attached as a
// partition of the outbox (ATTACH PARTITION of a filled table): its rows
// were never inserted into the outbox, so never streamed, and retention
// keeps them, while it deletes the rows written through the outbox.
func TestRetentionKeepsAttachedRows(t *testing.T) {
	e := newEnv(t, testenv.NewKafka(t))
	testenv.Exec(t, e.db, `DROP TABLE outbox`, partitionedByTime,
		`CREATE TABLE outbox_2026 PARTITION OF outbox FOR VALUES FROM ('2026-01-01') TO ('2027-01-01')`)
	e.cfg.Tables[0].Retention = &outbox.Retention{After: time.Second}
	e.retentionInterval = 100 * time.Millisecond
	r := e.start(t)
	testenv.Exec(t, e.db, `CREATE TABLE archive (LIKE outbox INCLUDING DEFAULTS)`,
		`INSERT INTO archive (created_at, aggregatetype, aggregateid, type, payload) SELECT '2025-06-01', 'order', 'archived', 'Old', '{}' FROM generate_series(1, 20)`,
		`ALTER TABLE outbox ATTACH PARTITION archive FOR VALUES FROM ('2025-01-01') TO ('2026-01-01')`)
	conn := testenv.Connect(t, e.db)
	var written []string
	for i := 0; i < 30; i++ {
		var id string
		if err := conn.QueryRow(context.Background(), `INSERT INTO outbox (created_at, aggregatetype, aggregateid, type, payload) VALUES ('2026-06-01', 'order', 'new', 'E', '{}') RETURNING id::text`).Scan(&id); err != nil {
			t.Fatal(err)
		}
		written = append(written, id)
	}
	c := e.kafka.NewConsumer(t, e.kafka.AllTopics())
	c.WaitFor(t, time.Minute, "30 events", func(recs []*kgo.Record) bool { return len(ids(recs)) >= 30 })
	testenv.Eventually(t, 30*time.Second, "the streamed rows deleted", func() bool {
		return testenv.Counter(t, r.p.Metrics().Registry, "cdc_retention_rows_deleted_total", "table", "public.outbox") >= 30
	})
	var archived int
	testenv.QueryRow(t, e.db, `SELECT count(*) FROM archive`, nil, &archived)
	if archived != 20 {
		t.Fatalf("%d of the 20 attached rows left; retention deleted rows that were never streamed", archived)
	}
}

// TestRenamedIntoAllTables: with a FOR ALL TABLES publication, a table
// filled under another name is renamed into the outbox's (the outbox
// renamed away in the same transaction). Its rows were streamed as
// another relation's, an unmapped insert each, so only the repair's
// snapshot holds them: a table published that way was taken as published
// since it was created, and they were lost. Every row of both tables
// arrives, once.
func TestRenamedIntoAllTables(t *testing.T) {
	e := newEnv(t, testenv.NewKafka(t))
	e.cfg.Postgres.CatalogCheckInterval = 100 * time.Millisecond
	testenv.Exec(t, e.db, `CREATE PUBLICATION outbox_cdc FOR ALL TABLES WITH (publish = 'insert')`)
	movedIn(t, e, `CREATE TABLE staged (LIKE outbox INCLUDING ALL)`, "staged",
		`BEGIN; ALTER TABLE outbox RENAME TO outbox_archive; ALTER TABLE staged RENAME TO outbox; COMMIT`, "outbox_archive")
}

// TestMovedIntoSchema: with a FOR TABLES IN SCHEMA publication
// (PostgreSQL 15+), a table filled in another schema is moved into the
// published one under the outbox's name (ALTER TABLE ... SET SCHEMA), the
// outbox moved out. Its rows were never streamed at all; every row of
// both tables arrives, once.
func TestMovedIntoSchema(t *testing.T) {
	e := newEnv(t, testenv.NewKafka(t))
	e.cfg.Postgres.CatalogCheckInterval = 100 * time.Millisecond
	testenv.Exec(t, e.db, `CREATE PUBLICATION outbox_cdc FOR TABLES IN SCHEMA public WITH (publish = 'insert')`,
		`CREATE SCHEMA staging`, `CREATE SCHEMA archive`)
	movedIn(t, e, `CREATE TABLE staging.outbox (LIKE public.outbox INCLUDING ALL)`, "staging.outbox",
		`BEGIN; ALTER TABLE public.outbox SET SCHEMA archive; ALTER TABLE staging.outbox SET SCHEMA public; COMMIT`, "archive.outbox")
}

// movedIn streams the outbox, creates a table with create and fills it
// as staged, runs move (which makes it the outbox, the old one named
// archived), writes on, and expects every row of both, once.
func movedIn(t *testing.T, e *env, create, staged, move, archived string) {
	t.Helper()
	e.start(t)
	c := e.kafka.NewConsumer(t, e.kafka.AllTopics())
	conn := testenv.Connect(t, e.db)
	for i := 0; i < 3; i++ {
		insertEvent(t, conn, "old", "Created")
	}
	c.WaitCount(t, time.Minute, 3)
	testenv.Exec(t, e.db, create,
		`INSERT INTO `+staged+` (aggregatetype, aggregateid, type, payload) SELECT 'order', 'staged-' || (i % 3), 'Created', '{}' FROM generate_series(1, 25) i`,
		move)
	for i := 0; i < 5; i++ {
		insertEvent(t, conn, "later", "Created")
	}
	want := rowsOf(t, e.db, "public.outbox")
	for id, agg := range rowsOf(t, e.db, archived) {
		want[id] = agg
	}
	if len(want) != 33 {
		t.Fatalf("%d rows in the two tables, want 33", len(want))
	}
	expectEvents(t, c, want, 0)
}

// TestExchangedNames: two configured tables exchange names while the
// connector streams. The watch stops, asking for each table to be named
// as it is now; with the configuration so changed the next start resumes
// each relation from the checkpoint, with the configuration that now
// names it (a start took each name's record, found the other table's
// relation under it, and stopped again at every start). Every event of
// each table arrives once, in its table's topic, those written while the
// connector was stopped included.
func TestExchangedNames(t *testing.T) {
	e := newEnv(t, testenv.NewKafka(t))
	e.cfg.Postgres.CatalogCheckInterval = 100 * time.Millisecond
	testenv.Exec(t, e.db, `CREATE TABLE outbox2 (LIKE outbox INCLUDING ALL)`)
	e.cfg.Tables[0].Topic = e.kafka.Prefix + "first"
	second := *e.cfg.Tables[0]
	second.Name.Name, second.Topic = "outbox2", e.kafka.Prefix+"second"
	e.cfg.Tables = append(e.cfg.Tables, &second)
	r := e.start(t)
	c := e.kafka.NewConsumer(t, e.kafka.AllTopics())
	insert := func(table, agg string, n int) {
		testenv.Exec(t, e.db, fmt.Sprintf(`INSERT INTO %s (aggregatetype, aggregateid, type, payload) SELECT 'order', '%s', 'Created', '{}' FROM generate_series(1, %d)`, table, agg, n))
	}
	insert("outbox", "first", 3)
	insert("outbox2", "second", 3)
	c.WaitCount(t, time.Minute, 6)
	testenv.Exec(t, e.db, `BEGIN; ALTER TABLE outbox RENAME TO tmp; ALTER TABLE outbox2 RENAME TO outbox; ALTER TABLE tmp RENAME TO outbox2; COMMIT`)
	insert("outbox2", "first", 4) // now the first table's name
	insert("outbox", "second", 4)
	if err := waitFatal(t, r); err == nil || !strings.Contains(err.Error(), "exchanged relations") {
		t.Fatalf("the watch stopped with %v, want the exchange named", err)
	}
	insert("outbox2", "first", 5)
	insert("outbox", "second", 5)
	e.cfg.Tables[0].Name.Name, e.cfg.Tables[1].Name.Name = "outbox2", "outbox"
	e.start(t)
	insert("outbox2", "first", 6)
	insert("outbox", "second", 6)
	topic := map[string]string{}
	for id, agg := range rowsOf(t, e.db, "outbox2") {
		topic[id] = e.cfg.Tables[0].Topic + "/" + agg
	}
	for id, agg := range rowsOf(t, e.db, "outbox") {
		topic[id] = e.cfg.Tables[1].Topic + "/" + agg
	}
	c.WaitCount(t, time.Minute, len(topic))
	c.SettleConfirmed(t, time.Minute, e.db, "outbox_cdc")
	for id, n := range ids(c.Records) {
		if n != 1 {
			t.Errorf("event %s arrived %d times", id, n)
		}
	}
	for _, rec := range c.Records {
		id := testenv.Header(rec, route.HeaderID)
		if got := rec.Topic + "/" + string(rec.Key); got != topic[id] {
			t.Errorf("event %s in %s, want %s", id, got, topic[id])
		}
	}
	if len(c.Records) != len(topic) || len(topic) != 36 {
		t.Errorf("%d records, %d rows, want 36", len(c.Records), len(topic))
	}
}

// TestUnloggedOutbox: with a FOR ALL TABLES publication, which allows it,
// the outbox is made unlogged while the connector streams: its inserts are
// no longer written to the WAL, so they never reach the slot, and the
// catalog still names the table in the publication (it streamed on,
// losing each). The watch stops, naming ALTER TABLE ... SET LOGGED, and so
// does a start while it is unlogged; once logged again, a start streams on
// and the rows written before and after arrive.
func TestUnloggedOutbox(t *testing.T) {
	e := newEnv(t, testenv.NewKafka(t))
	e.cfg.Postgres.CatalogCheckInterval = 100 * time.Millisecond
	testenv.Exec(t, e.db, `CREATE PUBLICATION outbox_cdc FOR ALL TABLES WITH (publish = 'insert')`)
	r := e.start(t)
	c := e.kafka.NewConsumer(t, e.kafka.AllTopics())
	conn := testenv.Connect(t, e.db)
	before := insertEvent(t, conn, "before", "Created")
	c.WaitCount(t, time.Minute, 1)
	testenv.Exec(t, e.db, `ALTER TABLE outbox SET UNLOGGED`)
	insertEvent(t, conn, "unlogged", "Created")
	err := waitFatal(t, r)
	if err == nil || !strings.Contains(err.Error(), "is unlogged") || !strings.Contains(err.Error(), "SET LOGGED") {
		t.Fatalf("the watch stopped with %v, want the unlogged table named", err)
	}
	r = e.launch(t, discard{})
	if err := waitFatal(t, r); err == nil || !strings.Contains(err.Error(), "is unlogged") {
		t.Fatalf("a start with the table unlogged: %v, want it refused", err)
	}
	testenv.Exec(t, e.db, `ALTER TABLE outbox SET LOGGED`)
	e.start(t)
	after := insertEvent(t, conn, "after", "Created")
	c.WaitFor(t, time.Minute, "the event written once logged again", func(recs []*kgo.Record) bool { return ids(recs)[after] == 1 })
	if got := ids(c.Records); got[before] != 1 {
		t.Errorf("the event from before arrived %d times", got[before])
	}
}

// TestRewrittenOutboxKeepsUnsentRows: a first start without a backfill
// leaves the table's older rows unsent (below its Floor), and retention
// deletes only what was streamed. A migration then rewrites the table
// (ALTER TABLE ... TYPE) while the connector streams, and again (VACUUM
// FULL) while it is stopped: the rewrite gives every row its xid, above
// the Floor, and retention deleted the never-sent rows. The watch, and
// the next start, set a new Floor; the unsent rows stay, and retention
// goes on deleting the rows streamed since.
func TestRewrittenOutboxKeepsUnsentRows(t *testing.T) {
	e := newEnv(t, testenv.NewKafka(t))
	e.cfg.Postgres.CatalogCheckInterval = 100 * time.Millisecond
	e.cfg.Tables[0].Retention = &outbox.Retention{After: time.Second}
	e.retentionInterval = 100 * time.Millisecond
	testenv.Exec(t, e.db, `INSERT INTO outbox (aggregatetype, aggregateid, type, payload) SELECT 'order', 'unsent', 'Created', '{}' FROM generate_series(1, 10)`)
	r := e.start(t)
	c := e.kafka.NewConsumer(t, e.kafka.AllTopics())
	count := func(agg string) int {
		var n int
		testenv.QueryRow(t, e.db, `SELECT count(*) FROM outbox WHERE aggregateid = $1`, []any{agg}, &n)
		return n
	}
	streamedAndDeleted := func(agg string) {
		t.Helper()
		testenv.Exec(t, e.db, `INSERT INTO outbox (aggregatetype, aggregateid, type, payload) SELECT 'order', '`+agg+`', 'Created', '{}' FROM generate_series(1, 5)`)
		testenv.Eventually(t, time.Minute, agg+"'s rows delivered and deleted", func() bool {
			if n := count("unsent"); n != 10 {
				t.Fatalf("%d of the 10 unsent rows left", n)
			}
			return count(agg) == 0
		})
	}
	streamedAndDeleted("early")
	rec, _ := loadCheckpoint(t, e)
	floor := rec.Tables["public.outbox"].Floor
	if floor == 0 || floor == checkpoint.NoFloor || rec.Tables["public.outbox"].Files == nil {
		t.Fatalf("the table's record %+v: want a floor above the unsent rows, with the files", rec.Tables["public.outbox"])
	}
	testenv.Exec(t, e.db, `ALTER TABLE outbox ALTER COLUMN type TYPE varchar(64)`)
	// Rows written before the watch sets the new floor stay (kept, not
	// lost); wait for it.
	testenv.Eventually(t, time.Minute, "a new floor", func() bool {
		rec, _ := loadCheckpoint(t, e)
		return rec.Tables["public.outbox"].Floor > floor
	})
	streamedAndDeleted("late")
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	testenv.Exec(t, e.db, `VACUUM FULL outbox`)
	e.start(t)
	streamedAndDeleted("later")
	if n := count("unsent"); n != 10 {
		t.Fatalf("%d of the 10 unsent rows left", n)
	}
	c.WaitCount(t, time.Minute, 15)
	c.SettleConfirmed(t, time.Minute, e.db, "outbox_cdc")
	got := map[string]int{}
	for _, rec := range c.Records {
		got[string(rec.Key)]++
	}
	if got["unsent"] != 0 || got["early"] != 5 || got["late"] != 5 || got["later"] != 5 {
		t.Errorf("events by aggregate %v, want 5 each of early, late and later", got)
	}
}

// TestUnloggedPartition: a partitioned outbox gets an unlogged partition
// (CREATE UNLOGGED TABLE ... PARTITION OF, which any publication allows)
// while the connector streams, with retention on: its inserts write no
// WAL. The connector streamed on, lost its 10 events and retention
// deleted their rows. The watch stops naming it, and its rows stay.
func TestUnloggedPartition(t *testing.T) {
	e := newEnv(t, testenv.NewKafka(t))
	testenv.Exec(t, e.db, `DROP TABLE outbox`, partitionedByTime,
		`CREATE TABLE outbox_2026 PARTITION OF outbox FOR VALUES FROM ('2026-01-01') TO ('2027-01-01')`)
	e.cfg.Postgres.CatalogCheckInterval = 100 * time.Millisecond
	e.cfg.Tables[0].Retention = &outbox.Retention{After: time.Second}
	e.retentionInterval = 100 * time.Millisecond
	r := e.start(t)
	testenv.Exec(t, e.db, `CREATE UNLOGGED TABLE outbox_2025 PARTITION OF outbox FOR VALUES FROM ('2025-01-01') TO ('2026-01-01')`,
		`INSERT INTO outbox (created_at, aggregatetype, aggregateid, type, payload) SELECT '2025-06-01', 'order', 'unlogged', 'E', '{}' FROM generate_series(1, 10)`)
	if err := waitFatal(t, r); err == nil || !strings.Contains(err.Error(), "is unlogged") {
		t.Fatalf("the watch stopped with %v, want the unlogged partition named", err)
	}
	var left int
	testenv.QueryRow(t, e.db, `SELECT count(*) FROM outbox_2025`, nil, &left)
	if left != 10 {
		t.Fatalf("%d of the unlogged partition's 10 rows left", left)
	}
}

// TestNameTakenWhileStopped: two configured tables; while the connector
// is stopped the second is dropped, the first renamed to its name, and a
// new table created under the first's name. The relation streamed as the
// first is now named as the second: it resumes as the second's (a
// relation is matched by its id first), and the new table under the
// first's name is repaired as a recreated table. The first's record kept
// naming that relation too, and its repair made it the first's former
// relation: inserts into the second went to the first's topic. Every
// event arrives once, in the topic its table now says.
func TestNameTakenWhileStopped(t *testing.T) {
	e := newEnv(t, testenv.NewKafka(t))
	e.cfg.Postgres.CatalogCheckInterval = 100 * time.Millisecond
	testenv.Exec(t, e.db, `CREATE TABLE outbox2 (LIKE outbox INCLUDING ALL)`)
	e.cfg.Tables[0].Topic = e.kafka.Prefix + "first"
	second := *e.cfg.Tables[0]
	second.Name.Name, second.Topic = "outbox2", e.kafka.Prefix+"second"
	e.cfg.Tables = append(e.cfg.Tables, &second)
	r := e.start(t)
	c := e.kafka.NewConsumer(t, e.kafka.AllTopics())
	insert := func(table, agg string, n int) {
		testenv.Exec(t, e.db, fmt.Sprintf(`INSERT INTO %s (aggregatetype, aggregateid, type, payload) SELECT 'order', '%s', 'Created', '{}' FROM generate_series(1, %d)`, table, agg, n))
	}
	insert("outbox", "a-before", 3)
	insert("outbox2", "b-before", 3)
	c.WaitCount(t, time.Minute, 6)
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	testenv.Exec(t, e.db, `BEGIN; DROP TABLE outbox2; ALTER TABLE outbox RENAME TO outbox2; CREATE TABLE outbox (LIKE outbox2 INCLUDING ALL); COMMIT`)
	insert("outbox2", "renamed-stopped", 4)
	insert("outbox", "new-stopped", 4)
	e.start(t)
	insert("outbox2", "renamed-after", 5)
	insert("outbox", "new-after", 5)
	want := map[string]string{} // id -> topic/key
	for id, agg := range rowsOf(t, e.db, "outbox2") {
		want[id] = e.cfg.Tables[1].Topic + "/" + agg
		if agg == "a-before" { // streamed as the first's, before the rename
			want[id] = e.cfg.Tables[0].Topic + "/" + agg
		}
	}
	for id, agg := range rowsOf(t, e.db, "outbox") {
		want[id] = e.cfg.Tables[0].Topic + "/" + agg
	}
	if len(want) != 21 {
		t.Fatalf("%d rows, want 21", len(want))
	}
	c.WaitFor(t, 2*time.Minute, "every row's event", func(recs []*kgo.Record) bool {
		got := ids(recs)
		for id := range want {
			if got[id] == 0 {
				return false
			}
		}
		return true
	})
	c.SettleConfirmed(t, time.Minute, e.db, "outbox_cdc")
	for id, n := range ids(c.Records) {
		if n != 1 {
			t.Errorf("event %s arrived %d times", id, n)
		}
	}
	for _, rec := range c.Records {
		id := testenv.Header(rec, route.HeaderID)
		if w, ok := want[id]; ok && rec.Topic+"/"+string(rec.Key) != w {
			t.Errorf("event %s in %s/%s, want %s", id, rec.Topic, rec.Key, w)
		}
	}
}
