package tableread

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxcdc/cdc/internal/postgres"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// TestCursorByPlaceReadsTheWholeRowsOrder is a generator of tables a
// cursor in a snapshot reads by place (Plan.byTID: the server sorts each
// row's key and ctid, and a chunk's rows are then read by ctid): rows of
// all sizes, NULLs, free space that deletes and VACUUM left, committed
// UPDATEs that move rows, rolled-back ones that clear a row's command
// id, a table inheriting from the outbox table (whose ctids repeat the
// parent's), a byte budget that cuts chunks, and a resume after a key.
// Read in one snapshot both ways, by place and with the rows sorted
// whole (the cursor WITH HOLD keeps), every chunk is the same: its rows,
// every value, in order, its Last and its Final. CDC_PLACE_SEED replays
// one case.
func TestCursorByPlaceReadsTheWholeRowsOrder(t *testing.T) {
	seeds := []uint64{uint64(time.Now().UnixNano()), 1, 2, 3}
	if s, err := strconv.ParseUint(os.Getenv("CDC_PLACE_SEED"), 10, 64); err == nil {
		seeds = []uint64{s}
	}
	for _, seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { byPlace(t, seed) })
	}
}

func byPlace(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, seed))
	db := pg.NewDatabase(t)
	testenv.Exec(t, db, `CREATE TABLE outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregatetype text NOT NULL,
		aggregateid text NOT NULL, type text NOT NULL, payload jsonb)`)
	child := rng.IntN(3) == 0 // then the rows are read whole
	if child {
		testenv.Exec(t, db, `CREATE TABLE outbox_old () INHERITS (outbox)`)
	}
	ctx := context.Background()
	w := testenv.Connect(t, db)
	for x := range 5 + rng.IntN(8) {
		table := "outbox"
		if child && rng.IntN(3) == 0 {
			table = "outbox_old"
		}
		err := pgx.BeginFunc(ctx, w, func(tx pgx.Tx) error {
			for seq := range 1 + rng.IntN(40) {
				var payload any // NULL, one time in four
				if rng.IntN(4) > 0 {
					payload = fmt.Sprintf(`{"pad": %q}`, randomText(rng, rng.IntN(4000)))
				}
				if _, err := tx.Exec(ctx, `INSERT INTO `+table+` (aggregatetype, aggregateid, type, payload) VALUES ('order', $1, $2, $3)`,
					fmt.Sprintf("agg-%d", rng.IntN(5)), fmt.Sprintf("%d:%d", x, seq), payload); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		switch rng.IntN(4) {
		case 0: // a committed update: the row moves, in the table and in the order
			testenv.Exec(t, db, fmt.Sprintf(`UPDATE outbox SET payload = '{"updated": true}' WHERE type = '%d:0'`, x))
		case 1: // rolled back: the row's command id is the updater's
			u, err := testenv.Connect(t, db).Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := u.Exec(ctx, fmt.Sprintf(`UPDATE outbox SET payload = '{}' WHERE type = '%d:0'`, x)); err != nil {
				t.Fatal(err)
			}
			if err := u.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
		case 2: // free space in earlier pages
			testenv.Exec(t, db, `DELETE FROM outbox WHERE random() < 0.2`, `VACUUM outbox`)
		}
	}
	conn, err := postgres.ConnectRows(ctx, postgres.Config{URL: db}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	chunk := 1 + rng.IntN(60)
	budget := int64(0)
	if rng.IntN(2) == 0 {
		budget = int64(1 + rng.IntN(20000))
	}
	plans := make([]*Plan, 2)
	for i := range plans {
		if plans[i], err = NewPlan(ctx, conn, testTable(), "", nil, OrderAuto, chunk); err != nil {
			t.Fatal(err)
		}
		plans[i].SetBudget(budget)
	}
	if plans[0].byTID == child {
		t.Fatalf("seed %d: a table with a child (%v) reads by place: %v; want by place only without one", seed, child, plans[0].byTID)
	}
	plans[1].byTID = false // the rows sorted whole: what it must match
	if _, err := conn.Exec(ctx, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"); err != nil {
		t.Fatal(err)
	}
	defer conn.Exec(ctx, "ROLLBACK")
	whole := read(t, ctx, conn, plans[1], nil, 0)
	if len(whole) == 0 || len(whole[0].Rows) == 0 {
		t.Fatalf("seed %d: no rows read", seed)
	}
	got := read(t, ctx, conn, plans[0], nil, 0)
	same(t, seed, "from the start", budget, got, whole)
	// A resume after the key of a row within the read, as a saved job's.
	var keys [][]string
	for _, c := range whole {
		for _, r := range c.Rows {
			keys = append(keys, plans[1].KeyOf(r))
		}
	}
	after := keys[rng.IntN(len(keys))]
	horizon := uint64(1 << 40) // no row written at or past it
	for i := range plans {
		plans[i].SetBudget(budget)
	}
	same(t, seed, fmt.Sprintf("after %v", after), budget, read(t, ctx, conn, plans[0], after, horizon), read(t, ctx, conn, plans[1], after, horizon))
}

// read reads every chunk of plan's cursor opened after key after with
// horizon (nil: from the start).
func read(t *testing.T, ctx context.Context, conn *pgx.Conn, plan *Plan, after []string, horizon uint64) []Chunk {
	t.Helper()
	cur, err := plan.Open(ctx, conn, after, horizon, false)
	if err != nil {
		t.Fatal(err)
	}
	defer cur.Close(ctx)
	if cur.byTID != plan.byTID {
		t.Fatalf("a cursor in a transaction reads by place: %v, its plan: %v", cur.byTID, plan.byTID)
	}
	var chunks []Chunk
	for {
		c, err := cur.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		chunks = append(chunks, c)
		if c.Final {
			return chunks
		}
	}
}

// same checks that the rows read by place (got) are those sorted whole
// (want), every value, in order, and that each of either's chunks keeps
// the budget: its rows but the last under it (a read by place that went
// past the budget asks again for fewer rows, so the chunks may split
// elsewhere).
func same(t *testing.T, seed uint64, what string, budget int64, got, want []Chunk) {
	t.Helper()
	flat := func(how string, cs []Chunk) [][][]byte {
		var rows [][][]byte
		for i, c := range cs {
			var bytes int64
			for j, r := range c.Rows {
				if j == len(c.Rows)-1 {
					break
				}
				for _, v := range r {
					bytes += int64(len(v))
				}
			}
			if budget > 0 && bytes >= budget {
				t.Fatalf("seed %d, %s: chunk %d %s holds %d bytes before its last row, past the budget of %d", seed, what, i, how, bytes, budget)
			}
			if c.Final != (i == len(cs)-1) {
				t.Fatalf("seed %d, %s: chunk %d of %d %s is final: %v", seed, what, i, len(cs), how, c.Final)
			}
			if n := len(c.Rows); n > 0 && !endsWith(c.Rows[n-1], c.Last) {
				t.Fatalf("seed %d, %s: chunk %d %s ends at %q, its last row's key is not that", seed, what, i, how, c.Last)
			}
			rows = append(rows, c.Rows...)
		}
		return rows
	}
	g, w := flat("by place", got), flat("sorted whole", want)
	if len(g) != len(w) {
		t.Fatalf("seed %d, %s: %d rows by place, %d sorted whole", seed, what, len(g), len(w))
	}
	for j := range w {
		if !slices.EqualFunc(g[j], w[j], func(a, b []byte) bool { return (a == nil) == (b == nil) && string(a) == string(b) }) {
			t.Fatalf("seed %d, %s: row %d by place is %s, sorted whole %s", seed, what, j, rowName(g[j]), rowName(w[j]))
		}
	}
}

// endsWith reports whether row's last values are key.
func endsWith(row [][]byte, key []string) bool {
	if len(key) == 0 || len(key) > len(row) {
		return false
	}
	for i, k := range key {
		if string(row[len(row)-len(key)+i]) != k {
			return false
		}
	}
	return true
}

// rowName names a row of the test's table: its id, its type (transaction
// and statement), the length of its payload and its key.
func rowName(r [][]byte) string {
	return fmt.Sprintf("id %s type %s payload %d bytes key %q", r[0], r[3], len(r[4]), r[5:])
}

// randomText is n letters, spaces and quotes, as JSON strings hold.
func randomText(rng *rand.Rand, n int) string {
	const chars = `abcdefghij KLMNOP'"\é`
	r := []rune(chars)
	b := make([]rune, n)
	for i := range b {
		b[i] = r[rng.IntN(len(r))]
	}
	return string(b)
}

// TestParsePlace: a ctid's text and a tableoid's, and what is neither.
func TestParsePlace(t *testing.T) {
	for _, c := range []struct {
		ctid, oid string
		want      place
		ok        bool
	}{
		{"(0,1)", "16384", place{16384, 0, 1}, true},
		{"(4294967295,65535)", "4294967295", place{1<<32 - 1, 1<<32 - 1, 1<<16 - 1}, true},
		{"(4294967296,1)", "1", place{}, false},
		{"(1,65536)", "1", place{}, false},
		{"(1,1)", "4294967296", place{}, false},
		{"(1;1)", "1", place{}, false},
		{"1,1", "1", place{}, false},
		{"(,1)", "1", place{}, false},
		{"(1,)", "1", place{}, false},
		{"(-1,1)", "1", place{}, false},
		{"(1,1)", "", place{}, false},
	} {
		got, ok := parsePlace([]byte(c.ctid), []byte(c.oid))
		if ok != c.ok || ok && got != c.want {
			t.Errorf("parsePlace(%q, %q) = %v, %v; want %v, %v", c.ctid, c.oid, got, ok, c.want, c.ok)
		}
	}
}
