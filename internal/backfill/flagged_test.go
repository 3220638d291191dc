package backfill

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// TestCopyHandsFlaggedCommitsToTheCursor: a first start's copy sorts
// once, by commit, command and place, and flags the commits where a row's
// cmin was overwritten (a DELETE or an UPDATE by another transaction,
// here rolled back, leaves its xmax set), which the cursor orders by
// place alone; at the first, the copy's rows end and the cursor, moved
// past them, reads on. Over generated backlogs (transactions of several
// INSERTs into a table with holes, so that place is not the order of the
// inserts; some transactions with a row deleted or updated and rolled
// back; chunks of 1 to 8 rows, budgets of 200 bytes to 64 KB; plain and
// partitioned), every row is sent once, in the order the cursor's rule
// gives, computed here from each row's xmin, cmin, xmax and ctid, and a
// save said whole is at a commit's end. A copy that kept its own order
// past a flag sends a flagged commit by command: the test counts the
// commits where that differs, and fails if there are none.
func TestCopyHandsFlaggedCommitsToTheCursor(t *testing.T) {
	differ := 0
	for seed := uint64(1); seed <= 6; seed++ {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) { differ += copyFlagged(t, seed) })
	}
	if differ == 0 {
		t.Fatal("no flagged commit whose order by place differs from its order by command: the test checked nothing a copy gets wrong")
	}
}

// copyFlagged runs one generated backlog's first start, and returns how
// many flagged commits the cursor's rule orders otherwise than the copy's.
func copyFlagged(t *testing.T, seed uint64) int {
	rng := rand.New(rand.NewPCG(seed, 5656))
	db, r := outboxWith20(t, seed%2 == 0)
	// Holes: rows of 1 to 2 KB, every other one gone and vacuumed, which
	// the inserts below fill as they fit.
	testenv.Exec(t, db, `DELETE FROM outbox`,
		`INSERT INTO outbox (aggregatetype, aggregateid, type, payload) SELECT 'hole', 'h', 'H' || i, jsonb_build_object('pad', repeat('h', 1000 + (i * 37) % 1000)) FROM generate_series(1, 120) i`,
		`DELETE FROM outbox WHERE (substr(type, 2)::int * 7) % 3 <> 0`, `VACUUM outbox`, `DELETE FROM outbox`)
	n, flagged := 0, 0
	for range 4 + rng.IntN(10) {
		stmts := []string{"BEGIN"}
		var mine []string
		for range 1 + rng.IntN(4) {
			var vals []string
			for range 1 + rng.IntN(6) {
				n++
				mine = append(mine, fmt.Sprintf("%06d", n))
				vals = append(vals, fmt.Sprintf(`('order', 'a%d', '%06d', jsonb_build_object('pad', repeat('x', %d)))`, rng.IntN(3), n, 10+rng.IntN(1800)))
			}
			stmts = append(stmts, `INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES `+strings.Join(vals, ", "))
		}
		testenv.Exec(t, db, append(stmts, "COMMIT")...)
		if rng.IntN(3) == 0 {
			flagged++
			victim := mine[rng.IntN(len(mine))]
			change := fmt.Sprintf(`DELETE FROM outbox WHERE type = '%s'`, victim)
			if rng.IntN(2) == 0 {
				change = fmt.Sprintf(`UPDATE outbox SET aggregateid = 'moved' WHERE type = '%s'`, victim)
			}
			testenv.Exec(t, db, "BEGIN", change, "ROLLBACK")
		}
	}
	if flagged == 0 {
		testenv.Exec(t, db, "BEGIN", fmt.Sprintf(`DELETE FROM outbox WHERE type = '%06d'`, n), "ROLLBACK")
	}
	want, differ := cursorRule(t, db)
	if len(want) != n {
		t.Fatalf("%d rows in the table, want %d", len(want), n)
	}
	r.ChunkBytes = int64(200 + rng.IntN(64<<10))
	r.StatusInterval = time.Nanosecond // a save after every chunk sent
	r.MaxInFlightBytes = 64 << 20
	chunk := 1 + rng.IntN(8)
	r.Tables[0].Backfill = &outbox.BackfillOptions{ChunkSize: chunk}
	s := &aheadSession{}
	job := checkpoint.Job{ID: "first", Table: "public.outbox", Initial: true}
	if err := r.FirstStart(context.Background(), s, []checkpoint.Job{job}, exportSnapshot(t, db), 1); err != nil {
		t.Fatal(err)
	}
	if got := s.types; !slices.EqualFunc(got, want, func(a string, w rowAt) bool { return a == w.typ }) {
		t.Fatalf("chunks of %d rows, a budget of %d bytes: sent %v; want every row once, in the cursor's order %v", chunk, r.ChunkBytes, got, want)
	}
	for _, sv := range s.saves {
		if sv.whole && sv.sent > 0 && sv.sent < len(want) && want[sv.sent].xmin == want[sv.sent-1].xmin {
			t.Fatalf("saved whole after %d events, inside the commit of %s and %s: a resume would skip the rest", sv.sent, want[sv.sent-1].typ, want[sv.sent].typ)
		}
	}
	return differ
}

// rowAt is a row as the cursor's order sees it.
type rowAt struct {
	typ, id    string
	xmin, cmin int64
	flagged    bool // its commit has a row with xmax set
	page, item int64
	xmaxSet    bool // an UPDATE, DELETE or lock by another transaction
}

// cursorRule reads the table's rows and orders them by the cursor's rule
// (package tableread, Plan.build): by commit (xmin); within a commit with
// no row whose xmax is set, by cmin; within one with such a row, by place
// alone; then by place and primary key. It returns how many flagged
// commits that order differs from their order by cmin in.
func cursorRule(t *testing.T, db string) ([]rowAt, int) {
	conn := testenv.Connect(t, db)
	rows, err := conn.Query(context.Background(), `SELECT type, id::text, xmin::text::bigint, cmin::text::bigint, xmax::text <> '0',
		(ctid::text::point)[0]::bigint, (ctid::text::point)[1]::bigint FROM outbox`)
	if err != nil {
		t.Fatal(err)
	}
	var all []rowAt
	for rows.Next() {
		var r rowAt
		if err := rows.Scan(&r.typ, &r.id, &r.xmin, &r.cmin, &r.xmaxSet, &r.page, &r.item); err != nil {
			t.Fatal(err)
		}
		all = append(all, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	set := map[int64]bool{}
	for _, r := range all {
		set[r.xmin] = set[r.xmin] || r.xmaxSet
	}
	for i := range all {
		all[i].flagged = set[all[i].xmin]
	}
	byPlace := func(a, b rowAt) int {
		return cmp.Or(cmp.Compare(a.page, b.page), cmp.Compare(a.item, b.item), cmp.Compare(a.id, b.id))
	}
	slices.SortFunc(all, func(a, b rowAt) int {
		if c := cmp.Compare(a.xmin, b.xmin); c != 0 || a.flagged {
			return cmp.Or(c, byPlace(a, b))
		}
		return cmp.Or(cmp.Compare(a.cmin, b.cmin), byPlace(a, b))
	})
	differ := 0
	for i := 0; i < len(all); {
		j := i
		for j < len(all) && all[j].xmin == all[i].xmin {
			j++
		}
		if all[i].flagged {
			byCmin := slices.Clone(all[i:j])
			slices.SortStableFunc(byCmin, func(a, b rowAt) int { return cmp.Compare(a.cmin, b.cmin) })
			if !slices.Equal(byCmin, all[i:j]) {
				differ++
			}
		}
		i = j
	}
	return all, differ
}
