package tableread

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/outboxcdc/cdc/internal/postgres"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// TestResumedCursorSkipsNoMovedRow: a job in commit order reads 10 rows,
// one transaction each, from a Cursor beside the stream, and is
// interrupted after the fourth. A transaction that took its xid before
// any of them were written, so an older one than the fourth row's, then
// updates the eighth row, not read yet, and commits: the row's xid is now
// below the saved position, in the order. The job resumed from its saved
// position and Horizon reads every row it had not read, the moved one
// included (a key alone would skip it), and the rows the updater's
// transaction and those after the horizon wrote again: at least once,
// none lost.
func TestResumedCursorSkipsNoMovedRow(t *testing.T) {
	db := pg.NewDatabase(t)
	testenv.Exec(t, db, `CREATE TABLE outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregatetype text NOT NULL,
		aggregateid text NOT NULL, type text NOT NULL, payload jsonb)`)
	ctx := context.Background()
	updater, err := testenv.Connect(t, db).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer updater.Rollback(ctx)
	if _, err := updater.Exec(ctx, `SELECT pg_current_xact_id()`); err != nil {
		t.Fatal(err)
	}
	w := testenv.Connect(t, db)
	for i := 1; i <= 10; i++ {
		if _, err := w.Exec(ctx, `INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('order', $1, 'E', '{}')`, fmt.Sprint(i)); err != nil {
			t.Fatal(err)
		}
	}
	conn, err := postgres.ConnectRows(ctx, postgres.Config{URL: db}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	plan, err := NewPlan(ctx, conn, testTable(), "", nil, OrderAuto, 4)
	if err != nil {
		t.Fatal(err)
	}
	if plan.Order != OrderCommit {
		t.Fatalf("order %q, want %q (track_commit_timestamp is off)", plan.Order, OrderCommit)
	}
	aggOf := func(rows [][][]byte) (aggs []string) {
		for _, r := range rows {
			aggs = append(aggs, string(r[2]))
		}
		return aggs
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
	if got := fmt.Sprint(aggOf(first.Rows)); got != "[1 2 3 4]" {
		t.Fatalf("first chunk %s, want the first four rows in commit order", got)
	}
	if _, err := updater.Exec(ctx, `UPDATE outbox SET type = 'Updated' WHERE aggregateid = '8'`); err != nil {
		t.Fatal(err)
	}
	if err := updater.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	// Without the horizon, the key alone skips the moved row.
	keyOnly, err := plan.Read(ctx, conn, first.Last, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(aggOf(keyOnly.Rows)); got != "[5 6 7 9]" {
		t.Fatalf("after the saved key alone: %s; want [5 6 7 9], the moved row 8 skipped (or the test proves nothing)", got)
	}
	resumed, err := plan.Open(ctx, conn, first.Last, cur.Horizon, false)
	if err != nil {
		t.Fatal(err)
	}
	defer resumed.Close(ctx)
	seen := map[string]int{}
	for {
		c, err := resumed.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range aggOf(c.Rows) {
			seen[a]++
		}
		if c.Final {
			break
		}
	}
	for i := 5; i <= 10; i++ {
		if seen[fmt.Sprint(i)] != 1 {
			t.Errorf("row %d read %d times after the resume, want once", i, seen[fmt.Sprint(i)])
		}
	}
	t.Logf("read after the resume: %v (horizon %d)", seen, cur.Horizon)
}

// TestMovesReachAnyRow: a cursor moved to a row past 2^31 - 1 (a MOVE's
// count is 32-bit, and 2^31 is a syntax error) gets there by steps
// forward, each within a 32-bit count, which add up to the row.
func TestMovesReachAnyRow(t *testing.T) {
	for _, pos := range []int64{0, 1, 1000, math.MaxInt32 - 1, math.MaxInt32, math.MaxInt32 + 1, 3*math.MaxInt32 + 7, 1 << 40} {
		var at int64
		for i, step := range moves(pos) {
			var n int64
			word := "FORWARD"
			if i == 0 {
				word = "ABSOLUTE"
			}
			if _, err := fmt.Sscanf(step, word+" %d", &n); err != nil {
				t.Fatalf("row %d: step %d is %q, want %s <count>", pos, i, step, word)
			}
			if n < 0 || n > math.MaxInt32 || i > 0 && n == 0 {
				t.Fatalf("row %d: step %q is no 32-bit count a MOVE takes", pos, step)
			}
			at += n
		}
		if at != pos {
			t.Fatalf("row %d: the moves %v reach row %d", pos, moves(pos), at)
		}
	}
}
