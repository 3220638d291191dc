package tableread

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxcdc/cdc/internal/postgres"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// TestChunksHoldEachRowsOwnValues: over generated tables (transactions
// of 1 to 30 rows, payloads of 2 bytes to 60 KB with tabs, newlines,
// backslashes and quotes in them, NULL payloads), chunk sizes and byte
// budgets, and FETCHes of several chunks' rows (SetReadRows), every row a Cursor's chunks (in the order of the commits) and
// keyset chunks (in the primary key's) hold is, value for value and key
// term for key term, the row the plan's query returns in one read, in its
// place: no row shares or overwrites another's values (a chunk cuts its
// rows' value slices from one allocation, Plan.collect), none is dropped
// or read twice where a budget cut a chunk and the cursor moved back.
func TestChunksHoldEachRowsOwnValues(t *testing.T) {
	for seed := uint64(1); seed <= 5; seed++ {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) { chunkRows(t, seed) })
	}
}

func chunkRows(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 0x0c4))
	ctx := context.Background()
	db := pg.NewDatabase(t)
	testenv.Exec(t, db, `CREATE TABLE outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregatetype text NOT NULL,
		aggregateid text NOT NULL, type text NOT NULL, payload jsonb)`)
	n := 0
	for range 2 + rng.IntN(12) {
		var vals []string
		for range 1 + rng.IntN(30) {
			n++
			payload := "NULL"
			if rng.IntN(8) > 0 {
				pad := strings.Repeat("x\t\\\n\"", 1+rng.IntN(8))
				if rng.IntN(6) == 0 {
					pad = strings.Repeat("y", rng.IntN(60_000))
				}
				payload = fmt.Sprintf(`jsonb_build_object('n', %d, 'pad', %s)`, n, pgQuote(pad))
			}
			vals = append(vals, fmt.Sprintf(`('order', 'a%d', 'E%d', %s)`, rng.IntN(4), n, payload))
		}
		testenv.Exec(t, db, `INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES `+strings.Join(vals, ", "))
	}
	conn, err := postgres.ConnectRows(ctx, postgres.Config{URL: db}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, order := range []Order{OrderAuto, OrderColumns} {
		chunk := 1 + rng.IntN(20)
		plan, err := NewPlan(ctx, conn, testTable(), "", nil, order, chunk)
		if err != nil {
			t.Fatal(err)
		}
		budget := int64(1 + rng.IntN(200_000))
		plan.SetBudget(budget)
		if plan.InCommitOrder() {
			plan.SetReadRows(chunk * rng.IntN(6)) // a FETCH of several chunks (backfill's readChunks)
		}
		whole := plan.rowsQuery("") // every row, in the plan's order
		if order == OrderColumns {
			whole = strings.Replace(plan.queries[0][0], "$1", "NULL", 1) // LIMIT NULL: every row
		}
		want := queryRows(t, conn, whole)
		if len(want) != n {
			t.Fatalf("%s: the plan's query read %d rows, want %d", order, len(want), n)
		}
		var got [][][]byte
		var next func() (Chunk, error)
		if plan.InCommitOrder() {
			cur, err := plan.Open(ctx, conn, nil, 0, false)
			if err != nil {
				t.Fatal(err)
			}
			defer cur.Close(ctx)
			next = func() (Chunk, error) { return cur.Next(ctx) }
		} else {
			var after []string
			next = func() (Chunk, error) {
				c, err := plan.Read(ctx, conn, after, nil)
				after = c.Last
				c.Final = c.Final || len(c.Rows) == 0
				return c, err
			}
		}
		for {
			c, err := next()
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, c.Rows...) // the chunks' rows as they are, not copies
			if c.Final {
				break
			}
		}
		if len(got) != len(want) {
			t.Fatalf("%s, chunks of %d rows in %d bytes: read %d rows, want %d", order, chunk, budget, len(got), len(want))
		}
		for i := range want {
			for j := range want[i] {
				if !bytes.Equal(got[i][j], want[i][j]) || (got[i][j] == nil) != (want[i][j] == nil) {
					t.Fatalf("%s, chunks of %d rows in %d bytes: row %d column %d is %.40q, want %.40q", order, chunk, budget, i, j, got[i][j], want[i][j])
				}
			}
		}
	}
}

// queryRows is every row of q, each value a copy (nil for NULL).
func queryRows(t *testing.T, conn *pgx.Conn, q string) [][][]byte {
	t.Helper()
	rr := conn.PgConn().ExecParams(context.Background(), q, nil, nil, nil, nil)
	var rows [][][]byte
	for rr.NextRow() {
		var row [][]byte
		for _, v := range rr.Values() {
			if v != nil {
				v = append([]byte{}, v...)
			}
			row = append(row, v)
		}
		rows = append(rows, row)
	}
	if _, err := rr.Close(); err != nil {
		t.Fatal(err)
	}
	return rows
}

func pgQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
