package tableread

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxcdc/cdc/internal/postgres"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// The commit order does not take the command id (cmin) from the table
// (found by the attack on the commit order): PostgreSQL's cmin system
// column is the raw t_cid field of the tuple header
// (heap_getsysattr: "cmin and cmax are now both aliases for the same
// field"): a DELETE or UPDATE by another transaction overwrites it with
// the deleter's command id (heap_update/heap_delete, HeapTupleHeaderSetCmax),
// and it stays overwritten when that transaction rolls back, or while it
// is still running. So cmin is not the command that inserted the row once
// anyone tried to update or delete it: a poller's published_at UPDATE that
// failed, a cleanup DELETE cancelled by a lock or statement timeout, or one
// still running when the cursor's snapshot is taken. Within a
// transaction the rows go in the order they lie in the table, and a job
// resumed reads again the whole transaction it stopped in.

// rolledBackUpdate writes, in one transaction of six statements, one
// aggregate's events 1 to 6 (cmin 0 to 5), then has another transaction
// make five writes of its own (its command counter at 5), UPDATE event
// victim (cid 5 written into that row's t_cid) and roll back. The row is
// unchanged and still the same insert's.
func rolledBackUpdate(t *testing.T, db string, victim, updaterCid int) {
	t.Helper()
	ctx := context.Background()
	testenv.Exec(t, db, `CREATE TABLE outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregatetype text NOT NULL,
		aggregateid text NOT NULL, type text NOT NULL, payload jsonb)`, `CREATE TABLE scratch (n int)`)
	w := testenv.Connect(t, db)
	err := pgx.BeginFunc(ctx, w, func(tx pgx.Tx) error {
		for i := 1; i <= 6; i++ {
			if _, err := tx.Exec(ctx, `INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('order', 'agg', $1, '{}')`, fmt.Sprint(i)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	u, err := testenv.Connect(t, db).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for range updaterCid {
		if _, err := u.Exec(ctx, `INSERT INTO scratch VALUES (1)`); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := u.Exec(ctx, `UPDATE outbox SET payload = '{"published": true}' WHERE type = $1`, fmt.Sprint(victim)); err != nil {
		t.Fatal(err)
	}
	if err := u.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	var cmins []string
	testenv.QueryRow(t, db, `SELECT array_agg(type || ':' || cmin::text ORDER BY type) FROM outbox`, nil, &cmins)
	t.Logf("type:cmin after the rolled-back update: %v", cmins)
}

func readAll(t *testing.T, cur *Cursor) (types []string) {
	t.Helper()
	for {
		c, err := cur.Next(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range c.Rows {
			types = append(types, string(r[3]))
		}
		if c.Final {
			return types
		}
	}
}

// TestOrderNotByCmin: the six events of one transaction read in commit
// order come out 1 to 6 after a rolled-back UPDATE of event 1 (at the
// updater's cid 5) rewrote its cmin; ordered by cmin they came out 2 3 4
// 5 1 6 (OrderCommitTime took the same term).
func TestOrderNotByCmin(t *testing.T) {
	db := pg.NewDatabase(t)
	rolledBackUpdate(t, db, 1, 5)
	ctx := context.Background()
	conn, err := postgres.ConnectRows(ctx, postgres.Config{URL: db}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	plan, err := NewPlan(ctx, conn, testTable(), "", nil, OrderAuto, 100)
	if err != nil {
		t.Fatal(err)
	}
	cur, err := plan.Open(ctx, conn, nil, 0, false)
	if err != nil {
		t.Fatal(err)
	}
	defer cur.Close(ctx)
	if got := fmt.Sprint(readAll(t, cur)); got != "[1 2 3 4 5 6]" {
		t.Errorf("one transaction's events read in commit order as %s, want [1 2 3 4 5 6] (order %s)", got, plan.Order)
	}
}

// TestResumedCursorReadsAgainTheWholeTransaction: a job in commit order
// reads events 1 to 3 of a transaction and is interrupted; a transaction
// then tries to UPDATE event 5, as its first write (cid 0), and rolls
// back. The resumed cursor reads the whole transaction again, event 5
// included: keyed on (xmin, cmin) it resumed after (X, 2), and event 5,
// rewritten to (X, 0), was never read (a first start's rows, which
// nothing else sends).
func TestResumedCursorReadsAgainTheWholeTransaction(t *testing.T) {
	db := pg.NewDatabase(t)
	testenv.Exec(t, db, `CREATE TABLE outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregatetype text NOT NULL,
		aggregateid text NOT NULL, type text NOT NULL, payload jsonb)`)
	ctx := context.Background()
	w := testenv.Connect(t, db)
	err := pgx.BeginFunc(ctx, w, func(tx pgx.Tx) error {
		for i := 1; i <= 6; i++ {
			if _, err := tx.Exec(ctx, `INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('order', 'agg', $1, '{}')`, fmt.Sprint(i)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := postgres.ConnectRows(ctx, postgres.Config{URL: db}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	plan, err := NewPlan(ctx, conn, testTable(), "", nil, OrderAuto, 3)
	if err != nil {
		t.Fatal(err)
	}
	cur, err := plan.Open(ctx, conn, nil, 0, false)
	if err != nil {
		t.Fatal(err)
	}
	first, err := cur.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cur.Close(ctx)
	var got []string
	for _, r := range first.Rows {
		got = append(got, string(r[3]))
	}
	if fmt.Sprint(got) != "[1 2 3]" {
		t.Fatalf("first chunk %v, want [1 2 3]", got)
	}
	// A poller's published_at UPDATE that fails (or one still running
	// when the resumed cursor is declared).
	u, err := testenv.Connect(t, db).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := u.Exec(ctx, `UPDATE outbox SET payload = '{"published": true}' WHERE type = '5'`); err != nil {
		t.Fatal(err)
	}
	if err := u.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	resumed, err := plan.Open(ctx, conn, first.Last, cur.Horizon, false)
	if err != nil {
		t.Fatal(err)
	}
	defer resumed.Close(ctx)
	rest := readAll(t, resumed)
	seen := map[string]bool{}
	for _, r := range rest {
		seen[r] = true
	}
	for i := 4; i <= 6; i++ {
		if !seen[fmt.Sprint(i)] {
			t.Errorf("event %d never read after the resume (read %v, saved key %v, horizon %d): lost", i, rest, first.Last, cur.Horizon)
		}
	}
}

// TestSavepointsInCommitTimestampOrder: with commit timestamps, a row
// written inside a savepoint has the savepoint's own xid, above the
// transaction's, but the transaction's commit time. Keyed on (commit
// time, xmin), the savepoints' events went after the rest of their
// transaction (1 3 5 6 2 4, a reorder within the aggregate found by
// TestRepairInCommitTimestampOrder); and a job resumed after a
// savepoint's row skipped the transaction's rows of a lower xmin for
// good. The rows of one commit go in table order, and a resumed job reads
// the whole commit again.
func TestSavepointsInCommitTimestampOrder(t *testing.T) {
	testenv.Require(t, pg)
	srv, err := testenv.StartPostgres("track_commit_timestamp=on")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	db := srv.NewDatabase(t)
	testenv.Exec(t, db, `CREATE TABLE outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregatetype text NOT NULL,
		aggregateid text NOT NULL, type text NOT NULL, payload jsonb)`)
	ctx := context.Background()
	w := testenv.Connect(t, db)
	err = pgx.BeginFunc(ctx, w, func(tx pgx.Tx) error {
		for i := 1; i <= 6; i++ {
			q := tx
			if i%2 == 0 { // 2, 4 and 6 each in a savepoint of its own
				if q, err = tx.Begin(ctx); err != nil {
					return err
				}
			}
			if _, err := q.Exec(ctx, `INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('order', 'agg', $1, '{}')`, fmt.Sprint(i)); err != nil {
				return err
			}
			if i%2 == 0 {
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
	conn, err := postgres.ConnectRows(ctx, postgres.Config{URL: db}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	plan, err := NewPlan(ctx, conn, testTable(), "", nil, OrderAuto, 2)
	if err != nil {
		t.Fatal(err)
	}
	if plan.Order != OrderCommitTime {
		t.Fatalf("order %s, want %s", plan.Order, OrderCommitTime)
	}
	whole, err := plan.Open(ctx, conn, nil, 0, false)
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(readAll(t, whole)); got != "[1 2 3 4 5 6]" {
		t.Fatalf("read %s, want [1 2 3 4 5 6]", got)
	}
	whole.Close(ctx)
	// Stopped after 1 and 2 (2 a savepoint's): the resume reads the
	// commit again from 1, and 3 to 6 all come.
	cur, err := plan.Open(ctx, conn, nil, 0, false)
	if err != nil {
		t.Fatal(err)
	}
	first, err := cur.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cur.Close(ctx)
	if len(first.Rows) != 2 || string(first.Rows[1][3]) != "2" {
		t.Fatalf("first chunk of %d rows, want events 1 and 2", len(first.Rows))
	}
	resumed, err := plan.Open(ctx, conn, first.Last, cur.Horizon, false)
	if err != nil {
		t.Fatal(err)
	}
	defer resumed.Close(ctx)
	if got := fmt.Sprint(readAll(t, resumed)); got != "[1 2 3 4 5 6]" {
		t.Fatalf("resumed after event 2 read %s, want the whole commit again, [1 2 3 4 5 6]", got)
	}
}

// TestConditionWithAPercentInCommitOrder: a backfill's condition is the
// operator's SQL, and a LIKE pattern's '%' in it is no format verb. The
// commit order's query was a format string with the condition in it:
// `aggregateid LIKE 'before-%'` came out as a syntax error (found by CI,
// cdc backfill on a hot standby's primary).
func TestConditionWithAPercentInCommitOrder(t *testing.T) {
	db := testenv.Require(t, pg).NewDatabase(t)
	testenv.Exec(t, db, `CREATE TABLE outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregatetype text NOT NULL,
		aggregateid text NOT NULL, type text NOT NULL, payload jsonb)`,
		`INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('order', 'before-1', '1', '{}')`,
		`INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('order', 'after-1', '2', '{}')`,
		`INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('order', 'before-2', '3', '{}')`)
	ctx := context.Background()
	conn, err := postgres.ConnectRows(ctx, postgres.Config{URL: db}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	plan, err := NewPlan(ctx, conn, testTable(), "aggregateid LIKE 'before-%'", nil, OrderCommit, 10)
	if err != nil {
		t.Fatal(err)
	}
	cur, err := plan.Open(ctx, conn, nil, 0, false)
	if err != nil {
		t.Fatal(err)
	}
	defer cur.Close(ctx)
	if got := fmt.Sprint(readAll(t, cur)); got != "[1 3]" {
		t.Fatalf("read %s, want [1 3]", got)
	}
}
