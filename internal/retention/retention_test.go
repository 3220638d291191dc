package retention

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pglogrepl"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/metrics"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/postgres"
	"github.com/outboxcdc/cdc/internal/setup"
	"github.com/outboxcdc/cdc/internal/testenv"
)

var pg *testenv.Postgres

func TestMain(m *testing.M) { testenv.Main(m, &pg) }

// TestThin: however many marks a long retention.after needs, at most
// maxMarks are kept, the oldest and the newest among them, evenly spaced.
func TestThin(t *testing.T) {
	t0 := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	var marks []checkpoint.RetentionMark
	for i := 0; i < 3*24*60; i++ { // three days of a mark a minute
		marks = append(marks, checkpoint.RetentionMark{XMin: uint64(i), LSN: pglogrepl.LSN(i), Time: t0.Add(time.Duration(i) * time.Minute), Timeline: 1})
		marks = thin(marks, maxMarks)
	}
	if len(marks) != maxMarks || marks[0].XMin != 0 || marks[len(marks)-1].XMin != 3*24*60-1 {
		t.Fatalf("%d marks from %d to %d; want %d from the first to the last", len(marks), marks[0].XMin, marks[len(marks)-1].XMin, maxMarks)
	}
	span := marks[len(marks)-1].Time.Sub(marks[0].Time)
	for i := 1; i < len(marks); i++ {
		if gap := marks[i].Time.Sub(marks[i-1].Time); gap > 3*span/maxMarks {
			t.Fatalf("marks %d and %d are %s apart; want about %s", i-1, i, gap, span/maxMarks)
		}
	}
}

// TestServerFits: a mark is used only where it can be a fact of the
// server's WAL history; one read back from a topic that claims more is
// dropped.
func TestServerFits(t *testing.T) {
	now := time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)
	srv := Server{Timeline: 2, NextXID: 1000, WALEnd: 0x5000, Now: now}
	good := checkpoint.RetentionMark{XMin: 900, LSN: 0x4000, Time: now.Add(-time.Hour), Timeline: 2}
	for _, tt := range []struct {
		name string
		edit func(*checkpoint.RetentionMark)
		fits bool
	}{
		{"genuine", func(*checkpoint.RetentionMark) {}, true},
		{"another timeline (a promotion)", func(m *checkpoint.RetentionMark) { m.Timeline = 1 }, false},
		{"xmin above the next xid (a restore)", func(m *checkpoint.RetentionMark) { m.XMin = 1 << 62 }, false},
		{"past the WAL's end (a restore)", func(m *checkpoint.RetentionMark) { m.LSN = 0x6000 }, false},
		{"from the future", func(m *checkpoint.RetentionMark) { m.Time = now.Add(time.Minute) }, false},
		{"written before timelines were kept", func(m *checkpoint.RetentionMark) { m.Timeline = 0 }, false},
	} {
		m := good
		tt.edit(&m)
		if got := srv.Fits(m); got != tt.fits {
			t.Errorf("%s: fits %v, want %v", tt.name, got, tt.fits)
		}
	}
}

// table is an outbox table made for a test, and the cleaner that keeps it.
type table struct {
	db    string
	src   *outbox.Source
	clean *Cleaner
	now   time.Time
	// confirmed is what the checkpoint says Kafka acknowledged; st what
	// the stream covered of the table.
	confirmed pglogrepl.LSN
	st        checkpoint.Table
}

// newTable makes the outbox (Debezium's columns, plus created_at), its
// publication, and a cleaner of it with after, whose clock is tb.now and
// whose saved checkpoint says the stream covered every row.
func newTable(t *testing.T, after time.Duration, mode string, ddl ...string) *table {
	t.Helper()
	db := testenv.Require(t, pg).NewDatabase(t)
	if len(ddl) == 0 {
		ddl = []string{`CREATE TABLE outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), created_at timestamptz NOT NULL DEFAULT now(),
			aggregatetype text NOT NULL, aggregateid text NOT NULL, type text NOT NULL, payload jsonb)`}
	}
	testenv.Exec(t, db, ddl...)
	testenv.Exec(t, db, `CREATE PUBLICATION outbox_cdc FOR TABLE outbox WITH (publish = 'insert', publish_via_partition_root = true)`)
	tb := &table{db: db, now: time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC),
		src: &outbox.Source{Name: outbox.TableName{Schema: "public", Name: "outbox"}, Retention: &outbox.Retention{After: after, BatchSize: 1000, Mode: mode}}}
	tb.st = tb.relation(t)
	var sys string
	testenv.QueryRow(t, db, `SELECT system_identifier::text FROM pg_control_system()`, nil, &sys)
	tb.clean = &Cleaner{
		Postgres: postgres.Config{URL: db, Publication: "outbox_cdc"}, Tables: []*outbox.Source{tb.src},
		Saved: func() checkpoint.Record {
			return checkpoint.Record{SystemID: sys, Timeline: 1, Confirmed: tb.confirmed, Tables: map[string]checkpoint.Table{"public.outbox": tb.st}}
		},
		Now: func() time.Time { return tb.now }, Pause: time.Millisecond,
		Log: hclog.NewNullLogger(), Metrics: metrics.New("t"),
	}
	return tb
}

// relation is the outbox's relation and membership now, every row covered.
func (tb *table) relation(t *testing.T) checkpoint.Table {
	t.Helper()
	conn := testenv.Connect(t, tb.db)
	var id uint32
	if err := conn.QueryRow(context.Background(), `SELECT 'outbox'::regclass::oid`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	rs, err := setup.ReadRelation(context.Background(), conn, "outbox_cdc", id)
	if err != nil || !rs.Published {
		t.Fatalf("the outbox's relation: %+v, %v", rs, err)
	}
	return checkpoint.Table{Rel: id, Member: rs.Member}
}

// ack says Kafka acknowledged everything written so far.
func (tb *table) ack(t *testing.T) { tb.confirmed = testenv.CurrentWAL(t, tb.db) }

// sweep runs one sweep.
func (tb *table) sweep(t *testing.T) {
	t.Helper()
	if err := tb.clean.Sweep(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// count is the number of rows where cond holds.
func (tb *table) count(t *testing.T, from, cond string) int {
	t.Helper()
	var n int
	testenv.QueryRow(t, tb.db, `SELECT count(*) FROM `+from+` WHERE `+cond, nil, &n)
	return n
}

// TestDayLongAfter: retention.after 24h, the docs' example, over two days
// of a clock moved five minutes a sweep, a row written each hour and
// acknowledged at once: no row goes before it is 24 h old, and each goes
// within half an hour after (marks were kept by count, at most about 4
// hours' worth, so none ever went).
func TestDayLongAfter(t *testing.T) {
	tb := newTable(t, 24*time.Hour, outbox.RetentionDelete)
	start := tb.now
	for step := 0; step < 48*12; step++ {
		if step%12 == 0 {
			testenv.Exec(t, tb.db, fmt.Sprintf(`INSERT INTO outbox (created_at, aggregatetype, aggregateid, type) VALUES ('%s', 'order', 'a', 'E')`, tb.now.Format(time.RFC3339)))
			tb.ack(t)
		}
		tb.sweep(t)
		if young := tb.count(t, "outbox", fmt.Sprintf(`created_at > '%s'`, tb.now.Add(-24*time.Hour).Format(time.RFC3339))); young != min(step/12+1, 24) {
			t.Fatalf("at %s: %d rows younger than 24 h left, want %d", tb.now.Sub(start), young, min(step/12+1, 24))
		}
		if old := tb.count(t, "outbox", fmt.Sprintf(`created_at < '%s'`, tb.now.Add(-24*time.Hour-30*time.Minute).Format(time.RFC3339))); old != 0 {
			t.Fatalf("at %s: %d rows older than 24 h 30 min left", tb.now.Sub(start), old)
		}
		tb.now = tb.now.Add(5 * time.Minute)
	}
	if n := len(tb.clean.Marks); n > maxMarks {
		t.Fatalf("%d marks kept, more than %d", n, maxMarks)
	}
}

// TestLateInsertKeepsPartition: drop_partitions looks at a partition
// without a lock, then a late event with an old created_at goes into it
// before the drop: the check under the drop's lock finds it, and the
// partition stays until its row is delivered (it was dropped with it).
func TestLateInsertKeepsPartition(t *testing.T) {
	tb := newTable(t, 24*time.Hour, outbox.RetentionDropPartitions,
		`CREATE TABLE outbox (id uuid NOT NULL DEFAULT gen_random_uuid(), created_at timestamptz NOT NULL, aggregatetype text NOT NULL,
			aggregateid text NOT NULL, type text NOT NULL, payload jsonb, PRIMARY KEY (id, created_at)) PARTITION BY RANGE (created_at)`,
		`CREATE TABLE outbox_2026_01 PARTITION OF outbox FOR VALUES FROM ('2026-01-01') TO ('2026-02-01')`,
		`CREATE TABLE outbox_default PARTITION OF outbox DEFAULT`)
	testenv.Exec(t, tb.db, `INSERT INTO outbox (created_at, aggregatetype, aggregateid, type) VALUES ('2026-01-10', 'order', 'a', 'E')`)
	tb.sweep(t) // a mark after the row
	tb.ack(t)
	late := 0
	tb.clean.afterLook = func(string) {
		late++
		testenv.Exec(t, tb.db, `INSERT INTO outbox (created_at, aggregatetype, aggregateid, type) VALUES ('2026-01-20', 'order', 'late', 'E')`)
	}
	tb.now = tb.now.Add(time.Minute)
	tb.sweep(t)
	if late != 1 || tb.count(t, "outbox_2026_01", "true") != 2 {
		t.Fatalf("after a late row written between the look and the drop (%d looks): %d rows in the partition, want it kept with both", late, tb.count(t, "outbox_2026_01", "true"))
	}
	tb.clean.afterLook = nil
	tb.ack(t)
	tb.now = tb.now.Add(time.Minute)
	tb.sweep(t) // a mark after the late row
	tb.sweep(t)
	var left int
	testenv.QueryRow(t, tb.db, `SELECT count(*) FROM pg_class WHERE relname = 'outbox_2026_01'`, nil, &left)
	if left != 0 {
		t.Fatal("the partition was kept once its rows were delivered")
	}
}

// TestMarksOfAnotherHistory: marks that do not fit the server (a forged
// record's {xmin: 2^62, lsn: 0/0, time: 1970}, marks of the history
// before a restore: an xmin above the next xid, a position past the WAL's
// end; another timeline's) are dropped and delete nothing, though the
// checkpoint says Kafka holds everything.
func TestMarksOfAnotherHistory(t *testing.T) {
	tb := newTable(t, time.Hour, outbox.RetentionDelete)
	testenv.Exec(t, tb.db, `INSERT INTO outbox (aggregatetype, aggregateid, type) SELECT 'order', 'a', 'E' FROM generate_series(1, 50)`)
	tb.confirmed = math.MaxUint64 >> 1
	tb.clean.Marks = []checkpoint.RetentionMark{
		{XMin: 1 << 62, LSN: 0, Time: time.Unix(0, 0), Timeline: 1},
		{XMin: 1 << 40, LSN: 1, Time: tb.now.Add(-48 * time.Hour), Timeline: 1},
		{XMin: 700, LSN: 0xFFFFFFFF << 8, Time: tb.now.Add(-48 * time.Hour), Timeline: 1},
		{XMin: 1 << 40, LSN: 1, Time: tb.now.Add(-48 * time.Hour), Timeline: 7},
	}
	tb.sweep(t)
	if n := tb.count(t, "outbox", "true"); n != 50 {
		t.Fatalf("%d of 50 rows left after marks of another history", n)
	}
	if len(tb.clean.Marks) != 1 || tb.clean.Marks[0].Time != tb.now {
		t.Fatalf("marks kept: %+v; want only the one just taken", tb.clean.Marks)
	}
}

// TestFactsThatNoLongerHold: the saved checkpoint says the stream covered
// the table and Kafka holds every row, but the table is not what it
// covered any more: removed from the publication and added back
// (another membership), or dropped and created again (another relation).
// Nothing is deleted. Renamed, it is the same relation: its rows go.
func TestFactsThatNoLongerHold(t *testing.T) {
	for _, tt := range []struct {
		name    string
		ddl     []string
		from    string
		deleted bool
	}{
		{"removed and added back", []string{`ALTER PUBLICATION outbox_cdc DROP TABLE outbox`, `ALTER PUBLICATION outbox_cdc ADD TABLE outbox`}, "outbox", false},
		{"removed", []string{`ALTER PUBLICATION outbox_cdc DROP TABLE outbox`}, "outbox", false},
		{"inserts not published", []string{`ALTER PUBLICATION outbox_cdc SET (publish = 'update')`}, "outbox", false},
		{"recreated", []string{`ALTER TABLE outbox RENAME TO gone`, `DROP TABLE gone`, `CREATE TABLE outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), created_at timestamptz NOT NULL DEFAULT now(),
			aggregatetype text NOT NULL, aggregateid text NOT NULL, type text NOT NULL, payload jsonb)`, `INSERT INTO outbox (aggregatetype, aggregateid, type) SELECT 'order', 'a', 'E' FROM generate_series(1, 20)`, `ALTER PUBLICATION outbox_cdc ADD TABLE outbox`}, "outbox", false},
		{"renamed", []string{`ALTER TABLE outbox RENAME TO outbox_v2`}, "outbox_v2", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tb := newTable(t, time.Minute, outbox.RetentionDelete)
			testenv.Exec(t, tb.db, `INSERT INTO outbox (aggregatetype, aggregateid, type) SELECT 'order', 'a', 'E' FROM generate_series(1, 20)`)
			tb.sweep(t)
			tb.ack(t)
			testenv.Exec(t, tb.db, tt.ddl...)
			tb.now = tb.now.Add(2 * time.Minute)
			tb.sweep(t)
			if n := tb.count(t, tt.from, "true"); (n == 0) != tt.deleted {
				t.Fatalf("%d of 20 rows left; want deleted %v", n, tt.deleted)
			}
		})
	}
}

// TestRewriteKeepsRowsBelowFloor: a table with rows below its Floor (never
// streamed: a first start without a backfill) is rewritten. ALTER TABLE
// ... TYPE and a column with a volatile default give every row the
// rewrite's xid, above the Floor, and all 20 never-streamed rows were
// deleted. Any rewrite (VACUUM FULL keeps the xids, but cannot be told
// apart) leaves the table alone until a new Floor is set; without one,
// the rows above the Floor go and those below stay.
func TestRewriteKeepsRowsBelowFloor(t *testing.T) {
	partitioned := []string{`CREATE TABLE outbox (id uuid NOT NULL DEFAULT gen_random_uuid(), created_at timestamptz NOT NULL DEFAULT now(),
			aggregatetype text NOT NULL, aggregateid text NOT NULL, type text NOT NULL, payload jsonb, PRIMARY KEY (id, created_at)) PARTITION BY RANGE (created_at)`,
		`CREATE TABLE outbox_default PARTITION OF outbox DEFAULT`}
	for _, tt := range []struct {
		name, sql string
		ddl       []string
		rewrite   bool
	}{
		{"alter type", `ALTER TABLE outbox ALTER COLUMN type TYPE varchar(64)`, nil, true},
		{"volatile default", `ALTER TABLE outbox ADD COLUMN seen timestamptz DEFAULT clock_timestamp()`, nil, true},
		{"vacuum full", `VACUUM FULL outbox`, nil, true},
		{"partitioned, alter type", `ALTER TABLE outbox ALTER COLUMN type TYPE varchar(64)`, partitioned, true},
		{"no rewrite", `ALTER TABLE outbox ADD COLUMN note text`, nil, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tb := newTable(t, time.Minute, outbox.RetentionDelete, tt.ddl...)
			testenv.Exec(t, tb.db, `INSERT INTO outbox (aggregatetype, aggregateid, type) SELECT 'order', 'before', 'E' FROM generate_series(1, 20)`)
			files, err := setup.RelFiles(context.Background(), testenv.Connect(t, tb.db), tb.st.Rel)
			if err != nil || len(files) != 1 {
				t.Fatalf("files %v, %v: want the one leaf's", files, err)
			}
			tb.st.Files = files
			testenv.QueryRow(t, tb.db, `SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint`, nil, &tb.st.Floor)
			testenv.Exec(t, tb.db, `INSERT INTO outbox (aggregatetype, aggregateid, type) SELECT 'order', 'after', 'E' FROM generate_series(1, 5)`)
			testenv.Exec(t, tb.db, tt.sql)
			tb.sweep(t)
			tb.ack(t)
			tb.now = tb.now.Add(2 * time.Minute)
			tb.sweep(t)
			if n := tb.count(t, "outbox", "aggregateid = 'before'"); n != 20 {
				t.Errorf("%d of the 20 rows below the floor (never streamed) left", n)
			}
			after := tb.count(t, "outbox", "aggregateid = 'after'")
			if want := map[bool]int{true: 5, false: 0}[tt.rewrite]; after != want {
				t.Errorf("%d of the 5 rows above the floor left, want %d", after, want)
			}
		})
	}
}

// TestRewriteKeepsAttachedRows: a table with 20 rows in it (never events)
// is attached as a partition of the outbox, and then rewritten. ALTER
// TABLE ... TYPE gives the attached rows the rewrite's xid, above the
// attach's, and retention deleted all 20 as streamed rows (drop_partitions
// dropped the partition with them). Whatever the rewrite, and however
// deep the partition, the attached rows stay; the rows the partition took
// as one are kept with them only when the rewrite could have carried
// attached rows, and a partition created in the table loses its streamed
// rows as before.
func TestRewriteKeepsAttachedRows(t *testing.T) {
	attach := []string{`CREATE TABLE outbox_old (LIKE outbox INCLUDING DEFAULTS)`, `INSERT INTO outbox_old (created_at, aggregatetype, aggregateid, type) SELECT '2025-06-01', 'order', 'attached', 'E' FROM generate_series(1, 20)`,
		`ALTER TABLE outbox ATTACH PARTITION outbox_old FOR VALUES FROM ('2025-01-01') TO ('2026-01-01')`}
	nested := []string{`CREATE TABLE outbox_old (LIKE outbox INCLUDING DEFAULTS) PARTITION BY RANGE (created_at)`,
		`CREATE TABLE outbox_old_h1 PARTITION OF outbox_old FOR VALUES FROM ('2025-01-01') TO ('2025-07-01')`,
		`CREATE TABLE outbox_old_h2 PARTITION OF outbox_old FOR VALUES FROM ('2025-07-01') TO ('2026-01-01')`,
		`INSERT INTO outbox_old (created_at, aggregatetype, aggregateid, type) SELECT '2025-06-01', 'order', 'attached', 'E' FROM generate_series(1, 20)`,
		`ALTER TABLE outbox ATTACH PARTITION outbox_old FOR VALUES FROM ('2025-01-01') TO ('2026-01-01')`}
	// A transaction older than the rewrite's touches the partition's
	// pg_class row after it: the row's xid is then below the rewrite's.
	olderAfter := func(t *testing.T, tb *table) {
		ctx := context.Background()
		older := testenv.Connect(t, tb.db)
		if _, err := older.Exec(ctx, `BEGIN; SELECT txid_current()`); err != nil {
			t.Fatal(err)
		}
		testenv.Exec(t, tb.db, `ALTER TABLE outbox ALTER COLUMN type TYPE varchar(64)`)
		if _, err := older.Exec(ctx, `ALTER TABLE outbox_old SET (autovacuum_vacuum_scale_factor = 0.01); COMMIT`); err != nil {
			t.Fatal(err)
		}
	}
	for _, tt := range []struct {
		name, mode, sql string
		attach          []string
		keepsStreamed   bool // the rows the attached partition took as one stay too
		run             func(*testing.T, *table)
	}{
		{"alter type", outbox.RetentionDelete, `ALTER TABLE outbox ALTER COLUMN type TYPE varchar(64)`, attach, true, nil},
		{"volatile default", outbox.RetentionDelete, `ALTER TABLE outbox ADD COLUMN seen timestamptz DEFAULT clock_timestamp()`, attach, true, nil},
		{"alter type, a partition of a partition", outbox.RetentionDelete, `ALTER TABLE outbox ALTER COLUMN type TYPE varchar(64)`, nested, true, nil},
		{"vacuum full of the partition", outbox.RetentionDelete, `VACUUM FULL outbox_old`, attach, true, nil},
		{"no rewrite", outbox.RetentionDelete, `ALTER TABLE outbox ADD COLUMN note text`, attach, false, nil},
		{"drop_partitions, alter type", outbox.RetentionDropPartitions, `ALTER TABLE outbox ALTER COLUMN type TYPE varchar(64)`, attach, true, nil},
		// The rewrite in a subtransaction, its parent's xid on pg_class.
		{"alter type in a savepoint, then a column", outbox.RetentionDelete, `BEGIN; SAVEPOINT s; ALTER TABLE outbox ALTER COLUMN type TYPE varchar(64); RELEASE s;
			ALTER TABLE outbox ADD COLUMN note text; COMMIT`, attach, true, nil},
		{"volatile default in a plpgsql block", outbox.RetentionDelete, `DO $$ BEGIN
			BEGIN ALTER TABLE outbox ADD COLUMN seen timestamptz DEFAULT clock_timestamp(); EXCEPTION WHEN others THEN RAISE NOTICE 'skipped'; END;
			ALTER TABLE outbox ADD COLUMN note text; END $$`, attach, true, nil},
		{"alter type, then an older transaction's reloptions", outbox.RetentionDelete, "", attach, true, olderAfter},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tb := newTable(t, time.Minute, tt.mode, `CREATE TABLE outbox (id uuid NOT NULL DEFAULT gen_random_uuid(), created_at timestamptz NOT NULL DEFAULT now(),
				aggregatetype text NOT NULL, aggregateid text NOT NULL, type text NOT NULL, payload jsonb, PRIMARY KEY (id, created_at)) PARTITION BY RANGE (created_at)`,
				`CREATE TABLE outbox_new PARTITION OF outbox FOR VALUES FROM ('2026-01-01') TO ('2027-01-01')`)
			testenv.Exec(t, tb.db, tt.attach...)
			testenv.Exec(t, tb.db, `INSERT INTO outbox (created_at, aggregatetype, aggregateid, type) SELECT '2025-07-01', 'order', 'streamed-old', 'E' FROM generate_series(1, 5)`,
				`INSERT INTO outbox (created_at, aggregatetype, aggregateid, type) SELECT '2026-06-01', 'order', 'streamed-new', 'E' FROM generate_series(1, 5)`)
			if tt.run != nil {
				tt.run(t, tb)
			} else {
				testenv.Exec(t, tb.db, tt.sql)
			}
			tb.sweep(t)
			tb.ack(t)
			tb.now = tb.now.Add(2 * time.Minute)
			tb.sweep(t)
			if n := tb.count(t, "outbox", "aggregateid = 'attached'"); n != 20 {
				t.Errorf("%d of the 20 attached rows (never streamed) left", n)
			}
			old := tb.count(t, "outbox", "aggregateid = 'streamed-old'")
			if want := map[bool]int{true: 5, false: 0}[tt.keepsStreamed]; old != want {
				t.Errorf("%d of the 5 streamed rows of the attached partition left, want %d", old, want)
			}
			said := false
			for key := range tb.clean.warned {
				said = said || strings.HasPrefix(key, "rewritten ")
			}
			if said != tt.keepsStreamed {
				t.Errorf("the log says the rewritten partition's rows are kept: %v, want %v", said, tt.keepsStreamed)
			}
			if tt.mode == outbox.RetentionDelete {
				if n := tb.count(t, "outbox", "aggregateid = 'streamed-new'"); n != 0 {
					t.Errorf("%d of the 5 streamed rows of the partition created in the table left, want 0", n)
				}
			}
		})
	}
}

// TestPendingDetachKeepsPartition: a DETACH PARTITION ... CONCURRENTLY
// that did not finish (cancelled by statement_timeout while a reader held
// the table) leaves the partition pending: out of the table's scans and of
// the stream, so rows written into it then are never events. drop_partitions
// dropped the old partition above it, and DROP TABLE took the pending one
// and its 7 rows along. It stays, whether the pending partition is the
// old one itself or one of its own partitions.
func TestPendingDetachKeepsPartition(t *testing.T) {
	for _, nested := range []bool{false, true} {
		t.Run(fmt.Sprintf("nested %v", nested), func(t *testing.T) {
			tb := newTable(t, time.Minute, outbox.RetentionDropPartitions, `CREATE TABLE outbox (id uuid NOT NULL DEFAULT gen_random_uuid(), created_at timestamptz NOT NULL,
				aggregatetype text NOT NULL, aggregateid text NOT NULL, type text NOT NULL, payload jsonb, PRIMARY KEY (id, created_at)) PARTITION BY RANGE (created_at)`)
			parent, leaf := "outbox", "outbox_2025"
			if nested {
				parent, leaf = "outbox_2025", "outbox_2025_h1"
				testenv.Exec(t, tb.db, `CREATE TABLE outbox_2025 PARTITION OF outbox FOR VALUES FROM ('2025-01-01') TO ('2026-01-01') PARTITION BY RANGE (created_at)`,
					`CREATE TABLE outbox_2025_h1 PARTITION OF outbox_2025 FOR VALUES FROM ('2025-01-01') TO ('2025-07-01')`,
					`CREATE TABLE outbox_2025_h2 PARTITION OF outbox_2025 FOR VALUES FROM ('2025-07-01') TO ('2026-01-01')`)
			} else {
				testenv.Exec(t, tb.db, `CREATE TABLE outbox_2025 PARTITION OF outbox FOR VALUES FROM ('2025-01-01') TO ('2026-01-01')`)
			}
			testenv.Exec(t, tb.db, `INSERT INTO outbox (created_at, aggregatetype, aggregateid, type) SELECT '2025-03-01', 'order', 'streamed', 'E' FROM generate_series(1, 5)`)
			ctx := context.Background()
			reader := testenv.Connect(t, tb.db)
			if _, err := reader.Exec(ctx, `BEGIN; SELECT count(*) FROM outbox`); err != nil {
				t.Fatal(err)
			}
			detach := testenv.Connect(t, tb.db)
			if _, err := detach.Exec(ctx, `SET statement_timeout = '500ms'`); err != nil {
				t.Fatal(err)
			}
			if _, err := detach.Exec(ctx, `ALTER TABLE `+parent+` DETACH PARTITION `+leaf+` CONCURRENTLY`); err == nil {
				t.Fatal("the detach finished while a reader held the table")
			}
			if _, err := reader.Exec(ctx, `COMMIT`); err != nil {
				t.Fatal(err)
			}
			var pending bool
			testenv.QueryRow(t, tb.db, `SELECT inhdetachpending FROM pg_inherits WHERE inhrelid = $1::regclass`, []any{leaf}, &pending)
			if !pending {
				t.Fatalf("%s is not pending a detach", leaf)
			}
			testenv.Exec(t, tb.db, `INSERT INTO `+leaf+` (created_at, aggregatetype, aggregateid, type) SELECT '2025-03-01', 'order', 'pending', 'E' FROM generate_series(1, 7)`)
			for i := 0; i < 3; i++ {
				tb.sweep(t)
				tb.ack(t)
				tb.now = tb.now.Add(2 * time.Minute)
			}
			var exists int
			testenv.QueryRow(t, tb.db, `SELECT count(*) FROM pg_class WHERE relname = $1`, []any{leaf}, &exists)
			if exists == 0 {
				t.Fatalf("%s and its 7 rows written while it was pending a detach (never streamed) were dropped", leaf)
			}
			if n := tb.count(t, leaf, "aggregateid = 'pending'"); n != 7 {
				t.Fatalf("%d of the 7 rows written into %s while it was pending a detach left", n, leaf)
			}
		})
	}
}
