package pipeline_test

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/postgres"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// recreateShape is a way of recreating the configured outbox table; sql
// may name the event ids pre writes before the table is published (%[1]s
// and %[2]s are INSERTs of agg-0's events 0 and 1 into the table they
// name, with fixed ids).
type recreateShape struct {
	name string
	sql  string
	pre  int
}

// preID is the fixed id of a shape's pre-written event seq.
func preID(seq int) string { return fmt.Sprintf("00000000-0000-0000-0000-%012d", seq+1) }

// recreateShapes are the shapes a repair must lose nothing of. The rows a
// table received before it was published, or under another relation's
// name, are in no stream: only the repair's snapshot holds them. Each
// shape here took one for a table published since before it held a row,
// whose rows the stream all carried (the attack on issue 53: a check of
// the catalog's and the rows' xmin, given up since).
func recreateShapes() []recreateShape {
	create := strings.TrimSuffix(strings.TrimPrefix(recreateSQL, "BEGIN;\nDROP TABLE outbox;\n"), "\nCOMMIT;")
	add := func(table string) string {
		return "ALTER PUBLICATION " + postgres.DefaultPublication + " ADD TABLE " + table + ";"
	}
	insert := func(table string, seq int) string {
		return fmt.Sprintf(`INSERT INTO %s (id, aggregatetype, aggregateid, type, payload) VALUES ('%s', 'order', 'agg-0', 'Seq', '%s');`, table, preID(seq), seqPayload("agg-0", seq))
	}
	renamed := strings.Replace(create, "TABLE outbox", "TABLE outbox_new", 1)
	return []recreateShape{
		{"published at creation", "BEGIN; DROP TABLE outbox; " + create + " " + add("outbox") + " COMMIT;", 0},
		{"filled at creation", "BEGIN; DROP TABLE outbox; " + create + " " + insert("outbox", 0) + " " + add("outbox") + " " + insert("outbox", 1) + " COMMIT;", 2},
		{"filled in a savepoint at creation", "BEGIN; DROP TABLE outbox; " + create + " SAVEPOINT s; " + insert("outbox", 0) + " RELEASE SAVEPOINT s; " + add("outbox") + " COMMIT;", 1},
		{"filled at creation, then updated", "BEGIN; DROP TABLE outbox; " + create + " " + insert("outbox", 0) + " " + add("outbox") + " COMMIT; UPDATE outbox SET type = type;", 1},
		{"renamed into its name", renamed + " " + add("outbox_new") + " " + insert("outbox_new", 0) + " BEGIN; DROP TABLE outbox; ALTER TABLE outbox_new RENAME TO outbox; COMMIT;", 1},
		{"not published, filled", "BEGIN; DROP TABLE outbox; " + create + " COMMIT; " + insert("outbox", 0), 1},
	}
}

// TestRecreatedShapesLoseNothing (rules 26, 29 and 30; the attack on issue
// 53): for each way of recreating the outbox table, with a second outbox
// table beside it, every event arrives once, each aggregate's in order:
// the rows written before the table was published or under another name,
// and those after. agg-1's events go into the other table: the order of
// one aggregate across two tables through a repair is a known limit
// (docs/operations.md). CDC_ORDER_SEED replays a draw of rows.
func TestRecreatedShapesLoseNothing(t *testing.T) {
	seed := orderSeed(t)
	for i, shape := range recreateShapes() {
		t.Run(shape.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, uint64(i)))
			e, kafka, tables := crossingEnv(t, 2, func(int) int { return 10 })
			for _, tb := range e.cfg.Tables {
				tb.Backfill = nil
			}
			e.cfg.Postgres.CatalogCheckInterval = 200 * time.Millisecond
			e.start(t)
			c := kafka.NewConsumer(t, kafka.AllTopics())
			conn := testenv.Connect(t, e.db)
			want := map[string]bool{}
			for seq := range shape.pre {
				want[preID(seq)] = true
			}
			testenv.Exec(t, e.db, shape.sql)
			seq := map[string]int{"agg-0": shape.pre}
			for range 2 + rng.IntN(6) {
				table, agg := tables[0], "agg-0"
				if rng.IntN(2) == 1 {
					table, agg = tables[1], "agg-1"
				}
				want[insertSeqInto(t, conn, table, agg, seq[agg])] = true
				seq[agg]++
			}
			waitForIDs(t, c, want)
			c.SettleConfirmed(t, time.Minute, e.db, "outbox_cdc")
			expectCommitOrder(t, c, want)
		})
	}
}

// TestCommitShownLate (rules 26, 30 and 32; seen once on PostgreSQL 18
// under load): the walsender sends a transaction once its commit record is
// flushed, before the committing backend makes it visible. Here the
// transaction waits, committed and invisible, for a synchronous standby
// that never answers (synchronous_standby_names, on a server of the
// test's own), while the stream reads it; then the wait is cancelled, and
// it shows. The connector's looks at the catalog for what the stream read
// saw the catalog as it was before:
//
//   - recreated: a transaction drops, creates, fills and publishes the
//     outbox table. The look the stream asked for at its streamed event
//     found no repair to start, and the stream sent the events as they
//     came, ahead of the row the repair sent once the commit showed (seq
//     0 after seq 4). The look now waits until a snapshot shows the
//     transaction (Watch.waitVisible).
//   - partition created: with publish_via_partition_root off, a
//     transaction creates a partition and inserts into it. The lookup of
//     the leaf's root found none, and the row was dropped as unmapped.
//     The lookup now waits too (leaf.Finder.Lookup).
func TestCommitShownLate(t *testing.T) {
	for _, shape := range []string{"recreated", "partition created"} {
		t.Run(shape, func(t *testing.T) {
			testenv.Require(t, pg)
			srv, err := testenv.StartPostgres() // its own: synchronous_standby_names is the server's
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(srv.Stop)
			db := srv.NewDatabase(t)
			testenv.Exec(t, db, schema)
			testenv.Exec(t, srv.URL, `ALTER SYSTEM SET synchronous_standby_names = 'phantom'`, `ALTER SYSTEM SET synchronous_commit = 'local'`, `SELECT pg_reload_conf()`)
			kafka := testenv.NewFakeKafka(t)
			log := &testenv.Buffer{}
			e := &env{db: db, kafka: kafka, cfg: newEnvConfig(db, kafka), logOut: io.MultiWriter(log, os.Stderr)}
			e.cfg.Postgres.CatalogCheckInterval = 200 * time.Millisecond
			want := map[string]bool{}
			var sql string
			if shape == "recreated" {
				sh := recreateShapes()[1] // filled at creation: seq 0 before the publishing, seq 1 after
				if sh.name != "filled at creation" {
					t.Fatalf("shape %q", sh.name)
				}
				sql, want[preID(0)], want[preID(1)] = sh.sql, true, true
			} else {
				testenv.Exec(t, db, partitionedSchema)
				// Not set back by a look while the test runs.
				e.cfg.Postgres.CatalogCheckInterval = 5 * time.Minute
				sql = `BEGIN; CREATE TABLE outbox_2027_03 PARTITION OF outbox FOR VALUES FROM ('2027-03-01') TO ('2027-04-01');
					INSERT INTO outbox (id, created_at, aggregatetype, aggregateid, type, payload) VALUES ('` + preID(0) + `', '2027-03-02', 'order', 'agg-0', 'Seq', '` + seqPayload("agg-0", 0) + `'); COMMIT;`
				want[preID(0)] = true
			}
			e.start(t)
			if shape != "recreated" {
				testenv.Exec(t, db, `ALTER PUBLICATION outbox_cdc SET (publish_via_partition_root = false)`)
			}
			c := kafka.NewConsumer(t, kafka.AllTopics())
			ctx := context.Background()
			committer := testenv.Connect(t, db)
			if _, err := committer.Exec(ctx, `SET synchronous_commit = on`); err != nil {
				t.Fatal(err)
			}
			pid := committer.PgConn().PID()
			done := make(chan error, 1)
			go func() { _, err := committer.Exec(ctx, sql); done <- err }()
			testenv.Eventually(t, time.Minute, "the commit to wait for the standby", func() bool {
				var n int
				testenv.QueryRow(t, db, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND wait_event = 'SyncRep'`, []any{int64(pid)}, &n)
				return n == 1
			})
			// The stream read the transaction once the connector says so,
			// or waits for it to show.
			testenv.Eventually(t, time.Minute, "the connector to look at the transaction, or wait for it", func() bool {
				var waits int
				testenv.QueryRow(t, db, `SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%pg_visible_in_snapshot%' AND pid <> pg_backend_pid()`, nil, &waits)
				return strings.Contains(log.String(), "no repair is under way") || strings.Contains(log.String(), "no configured table maps") || waits > 0
			})
			testenv.Exec(t, db, fmt.Sprintf(`SELECT pg_cancel_backend(%d)`, pid)) // committed locally: it shows now
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			conn := testenv.Connect(t, db)
			for seq := len(want); seq < 5; seq++ {
				id := preID(seq)
				if _, err := conn.Exec(ctx, `INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, 'order', 'agg-0', 'Seq', $2)`, id, seqPayload("agg-0", seq)); err != nil {
					t.Fatal(err)
				}
				want[id] = true
			}
			waitForIDs(t, c, want)
			c.SettleConfirmed(t, time.Minute, db, "outbox_cdc")
			expectCommitOrder(t, c, want)
		})
	}
}

// TestRepairWhereTheTableJoined (rule 32, the attack on issue 53's
// finding 3): two outbox tables carry aggregate agg-0's events; outbox is
// dropped and created again, and receives some of them before the
// connector publishes it. The connector published it, then took the
// repair's snapshot once every older transaction had ended, and wrote the
// repair's message after: events of the other table committed between
// the publishing and the message went ahead of the rows written before
// the publishing (an unrelated transaction left open makes that window as
// long as it stays open), and rows committed after the publishing were in
// the snapshot too. The table is now published, its snapshot exported and
// its message written in one transaction that holds the table's writers
// off (lockedRepair): every row written before it goes where it
// joined, every event after it in its place. CDC_ORDER_SEED replays a
// draw.
func TestRepairWhereTheTableJoined(t *testing.T) {
	seed := orderSeed(t)
	for i := range 3 {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, uint64(i)))
			e, kafka, tables := crossingEnv(t, 2, func(int) int { return 10 })
			for _, tb := range e.cfg.Tables {
				tb.Backfill = nil
			}
			e.cfg.Postgres.CatalogCheckInterval = 100 * time.Millisecond
			e.start(t)
			c := kafka.NewConsumer(t, kafka.AllTopics())
			conn := testenv.Connect(t, e.db)
			ctx := context.Background()
			older, err := testenv.Connect(t, e.db).Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer older.Rollback(ctx)
			if _, err := older.Exec(ctx, `SELECT pg_current_xact_id()`); err != nil {
				t.Fatal(err)
			}
			want, seq := map[string]bool{}, 0
			testenv.Exec(t, e.db, recreateSQL)
			for range 1 + rng.IntN(3) {
				want[insertSeqInto(t, conn, "outbox", "agg-0", seq)] = true
				seq++
			}
			testenv.Eventually(t, 30*time.Second, "the new table published", func() bool {
				var n int
				testenv.QueryRow(t, e.db, `SELECT count(*) FROM pg_publication_tables WHERE pubname = 'outbox_cdc' AND tablename = 'outbox'`, nil, &n)
				return n == 1
			})
			for range 2 + rng.IntN(5) {
				want[insertSeqInto(t, conn, tables[rng.IntN(2)], "agg-0", seq)] = true
				seq++
			}
			if err := older.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			want[insertSeqInto(t, conn, tables[1], "agg-0", seq)] = true
			waitForIDs(t, c, want)
			c.SettleConfirmed(t, time.Minute, e.db, "outbox_cdc")
			expectCommitOrder(t, c, want)
		})
	}
}

// TestSchemaSwappedIntoPlace (rules 26 and 30, the attack on issue 53):
// the configured table app.outbox is replaced by a schema swap: a new
// schema's outbox, created and published, takes an event as app_new.outbox
// (a relation no configured table names, streamed as unmapped), then the
// schemas exchange names. The repair sends that event from its snapshot.
// The decoder had cached the relation as unmapped, and pgoutput sends no
// Relation message anew for a schema's rename, so the table's later
// events were dropped as unmapped too, and confirmed: the decoder now maps
// it again once the watch names it the table's (Watch.name). The new
// table is a plain one, or a partitioned one whose leaves the publication
// names (publish_via_partition_root off): the watch names its leaves too.
func TestSchemaSwappedIntoPlace(t *testing.T) {
	for _, shape := range []string{"table", "partitioned, leaves published"} {
		t.Run(shape, func(t *testing.T) {
			e, kafka, _ := crossingEnv(t, 1, func(int) int { return 10 })
			testenv.Exec(t, e.db, `CREATE SCHEMA app`, `CREATE TABLE app.outbox (LIKE public.outbox INCLUDING ALL)`)
			e.cfg.Tables[0].Name = outbox.TableName{Schema: "app", Name: "outbox"}
			e.cfg.Tables[0].Backfill = nil
			e.cfg.Postgres.CatalogCheckInterval = 200 * time.Millisecond
			r := e.start(t)
			c := kafka.NewConsumer(t, kafka.AllTopics())
			conn := testenv.Connect(t, e.db)
			want := map[string]bool{insertSeqInto(t, conn, "app.outbox", "agg-0", 0): true}
			waitForIDs(t, c, want)
			create := `CREATE TABLE app_new.outbox (LIKE app.outbox INCLUDING ALL)`
			if shape != "table" {
				create = `CREATE TABLE app_new.outbox (id uuid NOT NULL DEFAULT gen_random_uuid(), aggregatetype text NOT NULL, aggregateid text NOT NULL, type text NOT NULL, payload jsonb, PRIMARY KEY (aggregateid, id)) PARTITION BY HASH (aggregateid);
					CREATE TABLE app_new.outbox_p0 PARTITION OF app_new.outbox FOR VALUES WITH (MODULUS 2, REMAINDER 0);
					CREATE TABLE app_new.outbox_p1 PARTITION OF app_new.outbox FOR VALUES WITH (MODULUS 2, REMAINDER 1);
					ALTER PUBLICATION ` + postgres.DefaultPublication + ` SET (publish_via_partition_root = false)`
			}
			testenv.Exec(t, e.db, `BEGIN; CREATE SCHEMA app_new; `+create+`; ALTER PUBLICATION `+postgres.DefaultPublication+` ADD TABLE app_new.outbox; COMMIT;`)
			for a := range 4 { // into both leaves
				want[insertSeqInto(t, conn, "app_new.outbox", fmt.Sprintf("agg-%d", a), 1)] = true
			}
			unmapped := []string{"app_new.outbox"}
			if shape != "table" {
				unmapped = []string{"app_new.outbox_p0", "app_new.outbox_p1"}
			}
			testenv.Eventually(t, time.Minute, "the stream to pass over the new table's inserts as unmapped", func() bool {
				for _, rel := range unmapped {
					if testenv.Counter(t, r.p.Metrics().Registry, "cdc_unmapped_relation_changes_total", "relation", rel) < 1 {
						return false
					}
				}
				return true
			})
			testenv.Exec(t, e.db, `BEGIN; ALTER SCHEMA app RENAME TO app_old; ALTER SCHEMA app_new RENAME TO app; COMMIT;`)
			testenv.Eventually(t, time.Minute, "the swapped table repaired", func() bool {
				return testenv.Counter(t, r.p.Metrics().Registry, "cdc_table_repairs_total", "table", "app.outbox") >= 1
			})
			for i := 2; i < 10; i++ {
				want[insertSeqInto(t, conn, "app.outbox", fmt.Sprintf("agg-%d", i%4), i)] = true
			}
			waitForIDs(t, c, want)
			c.SettleConfirmed(t, time.Minute, e.db, "outbox_cdc")
			expectCommitOrder(t, c, want)
		})
	}
}

// TestSchemaSwappedUnderAWriter is TestSchemaSwappedIntoPlace with a
// writer that inserts into app.outbox throughout, so into the new
// relation from the swap on. Until the watch names the new relation the
// table's, the stream passes over its inserts as unmapped (its cached name
// is app_new's), so those between a snapshot and a message written after
// it were in neither. Three ways to the repair:
//
//   - locked: the snapshot and the message are one transaction that holds
//     the writers off (lockedRepair);
//   - held: a transaction writing to the new table holds it past the
//     lock's wait, so the repair takes the snapshot, then the message
//     (startRepair): about 90 of 12,000 events were lost there, until
//     the watch named the relation before the snapshot (Watch.name);
//   - may not lock: the least-privileged role may only read the table,
//     and takes the same path.
//
// Every event written, to either table, arrives once, each aggregate's in
// order.
func TestSchemaSwappedUnderAWriter(t *testing.T) {
	for _, way := range []string{"locked", "held", "may not lock"} {
		t.Run(way, func(t *testing.T) {
			e, kafka, _ := crossingEnv(t, 1, func(int) int { return 10 })
			testenv.Exec(t, e.db, `CREATE SCHEMA app`, `CREATE TABLE app.outbox (LIKE public.outbox INCLUDING ALL)`,
				`CREATE SCHEMA app_new`, `CREATE TABLE app_new.outbox (LIKE app.outbox INCLUDING ALL)`)
			e.cfg.Tables[0].Name = outbox.TableName{Schema: "app", Name: "outbox"}
			e.cfg.Tables[0].Backfill = nil
			e.cfg.Postgres.CatalogCheckInterval = 200 * time.Millisecond
			if way == "may not lock" {
				e.cfg.Postgres.URL = testenv.LeastPrivileged(t, e.db, "app.outbox", true)
				var role string
				testenv.QueryRow(t, e.cfg.Postgres.URL, `SELECT current_user`, nil, &role)
				testenv.Exec(t, e.db, `GRANT USAGE ON SCHEMA app, app_new TO `+role, `GRANT SELECT ON app_new.outbox TO `+role)
			}
			r := e.start(t)
			c := kafka.NewConsumer(t, kafka.AllTopics())
			testenv.Exec(t, e.db, `ALTER PUBLICATION `+postgres.DefaultPublication+` ADD TABLE app_new.outbox`,
				`INSERT INTO app_new.outbox (aggregatetype, aggregateid, type, payload) VALUES ('order', 'early', 'Created', '{}')`)
			w := startWriter(t, e.db, strings.Replace(insertSQL, "INTO outbox", "INTO app.outbox", 1))
			w.waitWrites(t, 50)
			var held pgx.Tx
			if way == "held" {
				var err error
				if held, err = testenv.Connect(t, e.db).Begin(context.Background()); err != nil {
					t.Fatal(err)
				}
				if _, err := held.Exec(context.Background(), `INSERT INTO app_new.outbox (aggregatetype, aggregateid, type, payload) VALUES ('order', 'held', 'Created', '{}')`); err != nil {
					t.Fatal(err)
				}
			}
			testenv.Exec(t, e.db, `BEGIN; ALTER SCHEMA app RENAME TO app_old; ALTER SCHEMA app_new RENAME TO app; COMMIT;`)
			if held != nil {
				// Held until the watch's lock waited for it and gave up.
				waiting := func() bool {
					var n int
					testenv.QueryRow(t, e.db, `SELECT count(*) FROM pg_locks WHERE relation = 'app.outbox'::regclass AND mode = 'ShareLock' AND NOT granted`, nil, &n)
					return n > 0
				}
				testenv.Eventually(t, time.Minute, "the repair to wait for the table's lock", waiting)
				testenv.Eventually(t, time.Minute, "the repair to give the lock up", func() bool { return !waiting() })
				w.waitWrites(t, 50)
				if err := held.Commit(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
			testenv.Eventually(t, time.Minute, "the swapped table repaired", func() bool {
				return testenv.Counter(t, r.p.Metrics().Registry, "cdc_table_repairs_total", "table", "app.outbox") >= 1
			})
			w.waitWrites(t, 50)
			total := int(w.finish(t)) + 1
			if held != nil {
				total++
			}
			want := map[string]string{}
			for _, table := range []string{"app.outbox", "app_old.outbox"} {
				var got []string
				testenv.QueryRow(t, e.db, `SELECT coalesce(array_agg(id::text), '{}') FROM `+table, nil, &got)
				for _, id := range got {
					want[id] = table
				}
			}
			c.SettleConfirmed(t, time.Minute, e.db, "outbox_cdc")
			expectRecreated(t, c, want, total)
		})
	}
}

// TestSwapMetByAStreamBehind swaps a schema into place while the stream is
// behind the watch: Kafka holds its acks, so it has read no further than
// the old table's first event when the watch names the new relation the
// table's (Watch.name). It then meets the new relation's insert written
// before the swap as a fresh event of the table, and took it for the
// repair's place: the repair's rows, one of them written after the swap,
// went ahead of the old table's event written between the two ("k: seq 2
// arrived after ... 1" is seq 1 after seq 2). That insert ended before the
// naming, so the stream passes over it, as it would have in time
// (Watch.NamedAfter), and the repair sends it.
func TestSwapMetByAStreamBehind(t *testing.T) {
	for _, way := range []string{"locked", "may not lock"} {
		t.Run(way, func(t *testing.T) {
			e, kafka, _ := crossingEnv(t, 1, func(int) int { return 10 })
			testenv.Exec(t, e.db, `CREATE SCHEMA app`, `CREATE TABLE app.outbox (LIKE public.outbox INCLUDING ALL)`,
				`CREATE SCHEMA app_new`, `CREATE TABLE app_new.outbox (LIKE app.outbox INCLUDING ALL)`)
			e.cfg.Tables[0].Name = outbox.TableName{Schema: "app", Name: "outbox"}
			e.cfg.Tables[0].Backfill = nil
			e.cfg.Postgres.CatalogCheckInterval = 200 * time.Millisecond
			e.cfg.MaxInFlight = 1
			if way == "may not lock" {
				e.cfg.Postgres.URL = testenv.LeastPrivileged(t, e.db, "app.outbox", true)
				var role string
				testenv.QueryRow(t, e.cfg.Postgres.URL, `SELECT current_user`, nil, &role)
				testenv.Exec(t, e.db, `GRANT USAGE ON SCHEMA app, app_new TO `+role, `GRANT SELECT ON app_new.outbox TO `+role)
			}
			logs := &testenv.Buffer{}
			e.logOut = logs
			t.Cleanup(func() {
				if t.Failed() {
					t.Log(logs.String())
				}
			})
			var held atomic.Bool
			release := make(chan struct{})
			kafka.Fake.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
				kafka.Fake.KeepControl()
				if held.Load() {
					kafka.Fake.SleepControl(func() { <-release })
				}
				return nil, nil, false
			})
			r := e.start(t)
			c := kafka.NewConsumer(t, kafka.AllTopics())
			testenv.Exec(t, e.db, `ALTER PUBLICATION `+postgres.DefaultPublication+` ADD TABLE app_new.outbox`)
			held.Store(true)
			conn := testenv.Connect(t, e.db)
			want := map[string]bool{}
			want[insertSeqInto(t, conn, "app.outbox", "k", 0)] = true
			for i := 0; i < 20; i++ {
				want[insertSeqInto(t, conn, "app.outbox", "filler", i)] = true
			}
			want[insertSeqInto(t, conn, "app_new.outbox", "x", 0)] = true
			want[insertSeqInto(t, conn, "app.outbox", "k", 1)] = true
			testenv.Exec(t, e.db, `BEGIN; ALTER SCHEMA app RENAME TO app_old; ALTER SCHEMA app_new RENAME TO app; COMMIT;`)
			want[insertSeqInto(t, conn, "app.outbox", "k", 2)] = true
			testenv.Eventually(t, time.Minute, "the watch to name the new relation", func() bool {
				return strings.Contains(logs.String(), "sending the rows it received before it was published") ||
					strings.Contains(logs.String(), "repaired without holding its writers off") // named before either

			})
			if got := testenv.Counter(t, r.p.Metrics().Registry, "cdc_table_repairs_total", "table", "app.outbox"); got != 0 {
				t.Fatalf("the stream reached the repair before Kafka let it go (%v repairs): it was not behind", got)
			}
			held.Store(false)
			close(release)
			want[insertSeqInto(t, conn, "app.outbox", "k", 3)] = true
			expectCommitOrder(t, c, want)
		})
	}
}
