package tableread

import (
	"context"
	"fmt"
	"net/url"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outboxcdc/cdc/internal/postgres"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// TestCursorByPlaceHoldsTheBudget: 40 rows of about 1 MiB, a 1 MiB
// budget, a chunk that asks for 64 rows. The rows come by place in the
// order of their places, not the chunk's; a read that held them all
// before the budget cut the chunk held 40 MiB (review). It holds the
// budget and a row, drops the chunk, and asks again for fewer: one row
// kept, about what the rows sorted whole allocate.
func TestCursorByPlaceHoldsTheBudget(t *testing.T) {
	db := pg.NewDatabase(t)
	testenv.Exec(t, db, `CREATE TABLE outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregatetype text NOT NULL,
		aggregateid text NOT NULL, type text NOT NULL, payload jsonb)`,
		`ALTER TABLE outbox ALTER COLUMN payload SET STORAGE EXTERNAL`,
		`INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
		 SELECT 'order', 'a' || g, 'E', jsonb_build_object('pad', (SELECT string_agg(md5(random()::text || g || s), '') FROM generate_series(1, 32768) s))
		 FROM generate_series(1, 40) g`)
	ctx := context.Background()
	conn, err := postgres.ConnectRows(ctx, postgres.Config{URL: db}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	const budget = 1 << 20
	measure := func(byTID bool) (uint64, []string) {
		plan, err := NewPlan(ctx, conn, testTable(), "", nil, OrderAuto, 1000)
		if err != nil {
			t.Fatal(err)
		}
		plan.byTID = plan.byTID && byTID
		plan.SetBudget(budget)
		if _, err := conn.Exec(ctx, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"); err != nil {
			t.Fatal(err)
		}
		defer conn.Exec(ctx, "ROLLBACK")
		cur, err := plan.Open(ctx, conn, nil, 0, false)
		if err != nil {
			t.Fatal(err)
		}
		if cur.byTID != byTID {
			t.Fatalf("cursor by place %v, want %v", cur.byTID, byTID)
		}
		var ids []string
		first, err := cur.Next(ctx) // pgconn's buffers grown
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range first.Rows {
			ids = append(ids, string(r[2]))
		}
		plan.limit = firstLimit // as a first chunk asks
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		c, err := cur.Next(ctx)
		runtime.ReadMemStats(&after)
		if err != nil {
			t.Fatal(err)
		}
		if len(c.Rows) != 1 {
			t.Fatalf("by place %v: %d rows kept, want 1 (each row is the budget)", byTID, len(c.Rows))
		}
		for _, r := range c.Rows {
			ids = append(ids, string(r[2]))
		}
		for !c.Final {
			if c, err = cur.Next(ctx); err != nil {
				t.Fatal(err)
			}
			for _, r := range c.Rows {
				ids = append(ids, string(r[2]))
			}
		}
		return after.TotalAlloc - before.TotalAlloc, ids
	}
	whole, wholeIDs := measure(false)
	place, placeIDs := measure(true)
	t.Logf("one chunk of a row allocated %.1f MiB by place, %.1f MiB sorted whole (budget 1 MiB)", float64(place)/(1<<20), float64(whole)/(1<<20))
	if place > 4*budget+whole {
		t.Fatalf("a chunk read by place allocated %.1f MiB for a 1 MiB budget (sorted whole: %.1f MiB): it held the rows past the budget", float64(place)/(1<<20), float64(whole)/(1<<20))
	}
	if fmt.Sprint(placeIDs) != fmt.Sprint(wholeIDs) || len(placeIDs) != 40 {
		t.Fatalf("by place the rows came as %v, sorted whole as %v", placeIDs, wholeIDs)
	}
}

// TestReadByPlaceOnlyWhereAPlaceIsOneRow: a cursor reads by place only
// where a (tableoid, ctid) names one row for its snapshot's life. Not
// with a table inheriting from the outbox table (a foreign one repeats
// ctids within its tableoid: read by place, one row was sent twice and
// another never, review), not in READ COMMITTED (each read would take a
// newer snapshot), not where old_snapshot_threshold lets VACUUM take
// what the snapshot sees. Each reads every row, once.
func TestReadByPlaceOnlyWhereAPlaceIsOneRow(t *testing.T) {
	ctx := context.Background()
	open := func(t *testing.T, db, isolation string) (*Plan, *Cursor) {
		conn, err := postgres.ConnectRows(ctx, postgres.Config{URL: db}, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close(ctx) })
		plan, err := NewPlan(ctx, conn, testTable(), "", nil, OrderAuto, 2)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, "BEGIN ISOLATION LEVEL "+isolation+" READ ONLY"); err != nil {
			t.Fatal(err)
		}
		cur, err := plan.Open(ctx, conn, nil, 0, false)
		if err != nil {
			t.Fatal(err)
		}
		return plan, cur
	}
	const table = `CREATE TABLE outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregatetype text NOT NULL,
		aggregateid text NOT NULL, type text NOT NULL, payload jsonb)`
	t.Run("foreign child", func(t *testing.T) {
		db := pg.NewDatabase(t)
		u, err := url.Parse(db)
		if err != nil {
			t.Fatal(err)
		}
		testenv.Exec(t, db, table,
			`CREATE TABLE arch (id uuid NOT NULL, aggregatetype text NOT NULL, aggregateid text NOT NULL, type text NOT NULL, payload jsonb)`,
			`CREATE TABLE arch_2020 () INHERITS (arch)`,
			`INSERT INTO arch VALUES ('00000000-0000-0000-0000-00000000000a', 'order', 'old-a', 'Old', '{"n": "a"}')`,
			`INSERT INTO arch_2020 VALUES ('00000000-0000-0000-0000-00000000000b', 'order', 'old-b', 'Old', '{"n": "b"}')`,
			`CREATE EXTENSION postgres_fdw`,
			fmt.Sprintf(`CREATE SERVER loop FOREIGN DATA WRAPPER postgres_fdw OPTIONS (host '%s', port '%s', dbname '%s')`, u.Hostname(), u.Port(), strings.TrimPrefix(u.Path, "/")),
			`CREATE USER MAPPING FOR CURRENT_USER SERVER loop OPTIONS (user 'postgres')`,
			`CREATE FOREIGN TABLE outbox_arch () INHERITS (outbox) SERVER loop OPTIONS (table_name 'arch')`,
			`INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('order', 'new', 'E', '{}')`)
		plan, cur := open(t, db, "REPEATABLE READ")
		if plan.byTID || cur.byTID {
			t.Fatalf("a table with a child reads by place")
		}
		if got := aggregates(t, cur); got != "[new old-a old-b]" {
			t.Fatalf("read %s, want every row once: [new old-a old-b]", got)
		}
	})
	t.Run("read committed", func(t *testing.T) {
		db := pg.NewDatabase(t)
		testenv.Exec(t, db, table, `INSERT INTO outbox (aggregatetype, aggregateid, type, payload) SELECT 'order', g::text, 'E', '{}' FROM generate_series(1, 6) g`)
		plan, cur := open(t, db, "READ COMMITTED")
		if !plan.byTID || cur.byTID {
			t.Fatalf("in READ COMMITTED: plan by place %v, cursor %v; want the plan's, not the cursor's", plan.byTID, cur.byTID)
		}
		// Committed after the DECLARE, before the FETCH that sorts: the
		// cursor's snapshot lists the row as it was.
		testenv.Exec(t, db, `UPDATE outbox SET type = 'U' WHERE aggregateid = '2'`)
		if got := aggregates(t, cur); got != "[1 2 3 4 5 6]" {
			t.Fatalf("read %s, want every row once", got)
		}
	})
	t.Run("old_snapshot_threshold", func(t *testing.T) {
		var version int
		if err := testenv.Connect(t, pg.NewDatabase(t)).QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&version); err != nil {
			t.Fatal(err)
		}
		if version >= 170000 {
			t.Logf("PostgreSQL %d has no old_snapshot_threshold", version/10000)
			return
		}
		srv, err := testenv.StartPostgres("old_snapshot_threshold=0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(srv.Stop)
		db := srv.NewDatabase(t)
		testenv.Exec(t, db, table, `INSERT INTO outbox (aggregatetype, aggregateid, type, payload) SELECT 'order', g::text, 'E', '{}' FROM generate_series(1, 3) g`)
		plan, cur := open(t, db, "REPEATABLE READ")
		if plan.byTID || cur.byTID {
			t.Fatalf("with old_snapshot_threshold set, a plan reads by place")
		}
		if got := aggregates(t, cur); got != "[1 2 3]" {
			t.Fatalf("read %s, want every row once", got)
		}
	})
}

// aggregates reads every chunk of cur, and lists the rows' aggregate ids
// sorted.
func aggregates(t *testing.T, cur *Cursor) string {
	t.Helper()
	var ids []string
	for {
		c, err := cur.Next(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range c.Rows {
			ids = append(ids, string(r[2]))
		}
		if c.Final {
			slices.Sort(ids)
			return fmt.Sprint(ids)
		}
	}
}
