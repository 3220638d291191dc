package tableread

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxcdc/cdc/internal/postgres"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// TestCommitsReadInCommandOrder is a generator of what puts one
// transaction's rows out of the order they lie in the table: free space
// left by deletes and VACUUM (what retention and autovacuum leave) in
// earlier pages, rows of all sizes, a table hash-partitioned so that one
// transaction's rows spread over partitions, VACUUM between transactions.
// Each transaction writes its events one statement each; some rows then
// have an UPDATE by another transaction rolled back. A read in commit
// order returns each transaction's events in the order they were
// written, and the transactions in the order of their commits; a
// transaction one of whose rows lost its command id (the rolled-back
// UPDATE) returns them all. CDC_COMMAND_SEED replays one case.
func TestCommitsReadInCommandOrder(t *testing.T) {
	seeds := []uint64{uint64(time.Now().UnixNano()), 1, 2}
	if s, err := strconv.ParseUint(os.Getenv("CDC_COMMAND_SEED"), 10, 64); err == nil {
		seeds = []uint64{s}
	}
	for _, seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { commandOrder(t, seed) })
	}
}

func commandOrder(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, seed))
	db := pg.NewDatabase(t)
	ddl := `CREATE TABLE outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregatetype text NOT NULL,
		aggregateid text NOT NULL, type text NOT NULL, payload jsonb)`
	parts := rng.IntN(3) + 1 // 1: a plain table
	if parts > 1 {
		ddl += " PARTITION BY HASH (id)"
	}
	testenv.Exec(t, db, ddl)
	for i := 0; i < parts && parts > 1; i++ {
		testenv.Exec(t, db, fmt.Sprintf(`CREATE TABLE outbox_%d PARTITION OF outbox FOR VALUES WITH (MODULUS %d, REMAINDER %d)`, i, parts, i))
	}
	testenv.Exec(t, db, fmt.Sprintf(`INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
		SELECT 'filler', 'f', 'F', jsonb_build_object('pad', repeat('x', (i * 37) %% %d)) FROM generate_series(1, 400) i`, 200+rng.IntN(1500)),
		fmt.Sprintf(`DELETE FROM outbox WHERE random() < 0.%d`, 1+rng.IntN(5)), `VACUUM outbox`)
	ctx := context.Background()
	w := testenv.Connect(t, db)
	txns := 4 + rng.IntN(6)
	dirty, written := map[int]bool{}, map[int]int{}
	for x := range txns {
		n := 1 + rng.IntN(30)
		written[x] = n
		err := pgx.BeginFunc(ctx, w, func(tx pgx.Tx) error {
			for seq := range n {
				_, err := tx.Exec(ctx, `INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('order', 'agg', $1, jsonb_build_object('pad', repeat('y', $2::int)))`,
					fmt.Sprintf("%d:%d", x, seq), rng.IntN(3000))
				if err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if rng.IntN(4) == 0 { // a poller's UPDATE of one of them, rolled back
			u, err := testenv.Connect(t, db).Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := u.Exec(ctx, `UPDATE outbox SET payload = '{}' WHERE type = $1`, fmt.Sprintf("%d:%d", x, rng.IntN(n))); err != nil {
				t.Fatal(err)
			}
			if err := u.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			dirty[x] = true
		}
		if rng.IntN(3) == 0 {
			testenv.Exec(t, db, `DELETE FROM outbox WHERE aggregatetype = 'filler' AND random() < 0.2`, `VACUUM outbox`)
		}
	}
	conn, err := postgres.ConnectRows(ctx, postgres.Config{URL: db}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	plan, err := NewPlan(ctx, conn, testTable(), "aggregatetype = 'order'", nil, OrderAuto, 1+rng.IntN(50))
	if err != nil {
		t.Fatal(err)
	}
	cur, err := plan.Open(ctx, conn, nil, 0, false)
	if err != nil {
		t.Fatal(err)
	}
	defer cur.Close(ctx)
	got := map[int][]int{}
	var commits []int
	for _, typ := range readAll(t, cur) {
		var x, seq int
		if _, err := fmt.Sscanf(typ, "%d:%d", &x, &seq); err != nil {
			t.Fatalf("seed %d: a row of type %q", seed, typ)
		}
		if len(commits) == 0 || commits[len(commits)-1] != x {
			commits = append(commits, x)
		}
		got[x] = append(got[x], seq)
	}
	if want := len(got); len(commits) != want || !slices.IsSorted(commits) {
		t.Fatalf("seed %d (%d partitions): the transactions read in the order %v, want each once, in the order of their commits", seed, parts, commits)
	}
	for x := range txns {
		seqs := got[x]
		if !dirty[x] && !slices.IsSorted(seqs) || len(slices.Compact(slices.Sorted(slices.Values(seqs)))) != written[x] || len(seqs) != written[x] {
			t.Errorf("seed %d (%d partitions): transaction %d's events read as %s (a rolled-back update of one: %v)", seed, parts, x, strings.Trim(fmt.Sprint(seqs), "[]"), dirty[x])
		}
	}
}
