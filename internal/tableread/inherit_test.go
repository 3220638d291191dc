package tableread

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/outboxcdc/cdc/internal/postgres"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// TestReadsNoInheritingTable: a table that inherits from the outbox is a
// table of its own, whose inserts the stream takes for no table's (the
// publication names it by its own name, and it is no partition). A
// backfill, a repair and a count read the outbox's own rows only, in
// every order: not those of a child it had when the snapshot was taken,
// nor, above all, those of a table that joined by ALTER TABLE ...
// INHERIT after it (rows that were never the outbox's, which the
// snapshot's lock does not hold off), nor a grandchild's. Read without
// ONLY, the backfill sent them as events.
func TestReadsNoInheritingTable(t *testing.T) {
	for _, order := range []Order{OrderCommit, OrderColumns} {
		for _, when := range []string{"before the snapshot", "after the snapshot"} {
			t.Run(fmt.Sprintf("%s, %s", orderName(order), when), func(t *testing.T) {
				readsNoInheritingTable(t, order, when == "after the snapshot")
			})
		}
	}
}

func orderName(o Order) string {
	if o == OrderColumns {
		return "order of columns"
	}
	return string(o)
}

func readsNoInheritingTable(t *testing.T, order Order, after bool) {
	db := pg.NewDatabase(t)
	testenv.Exec(t, db, `CREATE TABLE outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregatetype text NOT NULL,
			aggregateid text NOT NULL, type text NOT NULL, payload jsonb)`,
		`INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('order', 'a', 'outbox-1', '{}'), ('order', 'a', 'outbox-2', '{}')`,
		`CREATE TABLE kid (LIKE outbox INCLUDING ALL)`,
		`INSERT INTO kid (aggregatetype, aggregateid, type, payload) VALUES ('order', 'a', 'kid', '{}')`,
		`CREATE TABLE grandkid (LIKE outbox INCLUDING ALL)`,
		`INSERT INTO grandkid (aggregatetype, aggregateid, type, payload) VALUES ('order', 'a', 'grandkid', '{}')`,
		`ALTER TABLE grandkid INHERIT kid`)
	inherit := `ALTER TABLE kid INHERIT outbox`
	if !after {
		testenv.Exec(t, db, inherit)
	}
	ctx := context.Background()
	conn, err := postgres.ConnectRows(ctx, postgres.Config{URL: db}, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"); err != nil {
		t.Fatal(err)
	}
	if err := HoldFiles(ctx, conn, testTable()); err != nil {
		t.Fatal(err)
	}
	if after {
		testenv.Exec(t, db, inherit)
	}
	var kids int
	testenv.QueryRow(t, db, `SELECT count(*) FROM pg_inherits WHERE inhparent = 'outbox'::regclass`, nil, &kids)
	if kids != 1 {
		t.Fatalf("kid does not inherit from outbox (%d children): the test tests nothing", kids)
	}
	plan, err := NewPlan(ctx, conn, testTable(), "", nil, order, 1)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	if plan.InCommitOrder() {
		cur, err := plan.Open(ctx, conn, nil, 0, false)
		if err != nil {
			t.Fatal(err)
		}
		got = readAll(t, cur)
		cur.Close(ctx)
	} else {
		var after []string
		for {
			c, err := plan.Read(ctx, conn, after, nil)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range c.Rows {
				got = append(got, string(r[3]))
			}
			if c.Final {
				break
			}
			after = c.Last
		}
	}
	slices.Sort(got)
	if fmt.Sprint(got) != "[outbox-1 outbox-2]" {
		t.Errorf("the backfill read %v, want the outbox's own rows [outbox-1 outbox-2]", got)
	}
	n, err := plan.Count(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Errorf("the count is %d rows, want the outbox's own 2", n)
	}
}

// TestHoldFilesTouchesNoInheritingTable (found by an attack): HoldFiles,
// which every read in a snapshot runs first, locked the table with a
// read of it and its children: a foreign table inheriting from the
// outbox that cannot be scanned (its wrapper here has no handler, as an
// archive whose server is down fails) failed every first start, and a
// child locked by a migration held it, for rows no read takes. It locks
// the table ONLY, and a partitioned table's leaves.
func TestHoldFilesTouchesNoInheritingTable(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup []string
		lock  string // taken by another transaction first
	}{
		{"foreign child", []string{`CREATE FOREIGN DATA WRAPPER unreachable`, `CREATE SERVER archive_server FOREIGN DATA WRAPPER unreachable`,
			`CREATE FOREIGN TABLE archive () INHERITS (outbox) SERVER archive_server`}, ""},
		{"locked child", []string{`CREATE TABLE kid () INHERITS (outbox)`}, `LOCK TABLE ONLY kid IN ACCESS EXCLUSIVE MODE`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := pg.NewDatabase(t)
			testenv.Exec(t, db, append([]string{`CREATE TABLE outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregatetype text NOT NULL,
				aggregateid text NOT NULL, type text NOT NULL, payload jsonb)`,
				`INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('order', 'a', 'outbox-1', '{}')`}, tc.setup...)...)
			ctx := context.Background()
			if tc.lock != "" {
				other := testenv.Connect(t, db)
				if _, err := other.Exec(ctx, "BEGIN; "+tc.lock); err != nil {
					t.Fatal(err)
				}
			}
			conn, err := postgres.ConnectRows(ctx, postgres.Config{URL: db}, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			if _, err := conn.Exec(ctx, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"); err != nil {
				t.Fatal(err)
			}
			// A wait on the child's lock fails, instead of hanging the test.
			if _, err := conn.Exec(ctx, "SET LOCAL lock_timeout = '2s'"); err != nil {
				t.Fatal(err)
			}
			if err := HoldFiles(ctx, conn, testTable()); err != nil {
				t.Fatalf("HoldFiles failed on a table that inherits from the outbox, which no read takes: %v", err)
			}
			plan, err := NewPlan(ctx, conn, testTable(), "", nil, OrderCommit, 10)
			if err != nil {
				t.Fatal(err)
			}
			cur, err := plan.Open(ctx, conn, nil, 0, false)
			if err != nil {
				t.Fatal(err)
			}
			defer cur.Close(ctx)
			if got := fmt.Sprint(readAll(t, cur)); got != "[outbox-1]" {
				t.Errorf("read %s, want [outbox-1]", got)
			}
		})
	}
}
