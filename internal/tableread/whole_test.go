package tableread

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxcdc/cdc/internal/postgres"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// TestResumePastAWholeCommit (issue 53's attack, a merged first start
// stopped at max_parked_keys): a job in commit order that stops right
// after a commit it sent whole resumes past that commit (Plan.Whole and
// Open's whole); resumed at the commit's first row, it read that commit
// again, and an event a redrive had dropped to the dead-letter topic
// parked its key anew, so the connector stopped again. Drawn: commits of
// 1 to 5 rows (some in savepoints), the chunk size and the row the job
// stopped after; in each case every row after it is read (nothing lost),
// in the order, and a commit sent whole is not read again.
// CDC_WHOLE_SEED replays one seed.
func TestResumePastAWholeCommit(t *testing.T) {
	testenv.Require(t, pg)
	for _, order := range []Order{OrderCommit, OrderCommitTime} {
		t.Run(string(order), func(t *testing.T) {
			db := pg.NewDatabase(t)
			if order == OrderCommitTime {
				srv, err := testenv.StartPostgres("track_commit_timestamp=on")
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(srv.Stop)
				db = srv.NewDatabase(t)
			}
			seed := rand.Uint64()
			if s := os.Getenv("CDC_WHOLE_SEED"); s != "" {
				seed, _ = strconv.ParseUint(s, 10, 64)
			}
			t.Logf("seed %d (CDC_WHOLE_SEED replays it)", seed)
			rng := rand.New(rand.NewPCG(seed, 1))
			commitOf := writeCommits(t, db, rng)
			ctx := context.Background()
			conn, err := postgres.ConnectRows(ctx, postgres.Config{URL: db}, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			wholes := 0
			for range 40 {
				if resumePast(t, conn, order, commitOf, 1+rng.IntN(7), rng) {
					wholes++
				}
			}
			if wholes == 0 {
				t.Fatal("no round stopped after a commit sent whole: the test proves nothing")
			}
		})
	}
}

// writeCommits writes 30 commits of 1 to 5 events each (type: the event's
// number, 1 up), a third of the rows in savepoints, and returns the
// commit of each event.
func writeCommits(t *testing.T, db string, rng *rand.Rand) map[string]int {
	t.Helper()
	ctx := context.Background()
	testenv.Exec(t, db, `CREATE TABLE outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregatetype text NOT NULL,
		aggregateid text NOT NULL, type text NOT NULL, payload jsonb)`)
	w := testenv.Connect(t, db)
	commitOf, n := map[string]int{}, 0
	for c := range 30 {
		err := pgx.BeginFunc(ctx, w, func(tx pgx.Tx) error {
			for range 1 + rng.IntN(5) {
				n++
				q := tx
				var err error
				if rng.IntN(3) == 0 {
					if q, err = tx.Begin(ctx); err != nil {
						return err
					}
				}
				if _, err := q.Exec(ctx, `INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('order', 'agg', $1, '{}')`, fmt.Sprint(n)); err != nil {
					return err
				}
				if q != tx {
					if err := q.Commit(ctx); err != nil {
						return err
					}
				}
				commitOf[fmt.Sprint(n)] = c
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return commitOf
}

// resumePast reads the table in chunks of chunk rows, stops after a drawn
// row as a job saving then would (Whole of what is left of its chunk),
// resumes, and checks what the resume reads. It reports whether the stop
// was after a commit sent whole.
func resumePast(t *testing.T, conn *pgx.Conn, order Order, commitOf map[string]int, chunk int, rng *rand.Rand) bool {
	t.Helper()
	ctx := context.Background()
	plan, err := NewPlan(ctx, conn, testTable(), "", nil, OrderAuto, chunk)
	if err != nil {
		t.Fatal(err)
	}
	if plan.Order != order {
		t.Fatalf("order %s, want %s", plan.Order, order)
	}
	cur, err := plan.Open(ctx, conn, nil, 0, false)
	if err != nil {
		t.Fatal(err)
	}
	var all []string
	var chunks []Chunk
	for {
		c, err := cur.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		chunks = append(chunks, c)
		for _, r := range c.Rows {
			all = append(all, string(r[3]))
		}
		if c.Final {
			break
		}
	}
	cur.Close(ctx)
	if len(all) != len(commitOf) {
		t.Fatalf("read %d events, want %d", len(all), len(commitOf))
	}
	// The commit a row's place in the order tells: its transaction's with
	// commit timestamps; without, its xmin, a savepoint's own (OrderCommit).
	group := commitOf
	if order == OrderCommit {
		group = map[string]int{}
		rows, err := conn.Query(ctx, `SELECT type, xmin::text::bigint FROM public.outbox`)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var typ string
			var x int
			if err := rows.Scan(&typ, &x); err != nil {
				t.Fatal(err)
			}
			group[typ] = x
		}
		if rows.Err() != nil {
			t.Fatal(rows.Err())
		}
	}
	// Stop after row k of chunk i: the job saves the key of that row,
	// with what is left of the chunk.
	i := rng.IntN(len(chunks))
	for len(chunks[i].Rows) == 0 {
		i--
	}
	k := rng.IntN(len(chunks[i].Rows))
	rows := chunks[i].Rows
	after := plan.KeyOf(rows[k])
	whole := plan.Whole(after, rows[k+1:], chunks[i].Final)
	last := string(rows[k][3])
	resumed, err := plan.Open(ctx, conn, after, cur.Horizon, whole)
	if err != nil {
		t.Fatal(err)
	}
	defer resumed.Close(ctx)
	rest := readAll(t, resumed)
	// The resume reads the rows after the stop, in order, from the first
	// of the stop's commit; with whole, from the next commit's.
	pos, from := 0, 0
	for j, v := range all {
		if v == last {
			pos = j
		}
	}
	for from = pos; !whole && from > 0 && group[all[from-1]] == group[last]; from-- {
	}
	if whole {
		from = pos + 1
	}
	if want := all[from:]; fmt.Sprint(rest) != fmt.Sprint(want) {
		t.Fatalf("stopped after event %s (chunk %d of %d rows, whole %v): the resume read %v, want %v", last, chunk, len(rows), whole, rest, want)
	}
	switch next := rows[k+1:]; {
	case whole && pos+1 < len(all) && group[all[pos+1]] == group[last]:
		t.Fatalf("stopped after event %s: whole, though the next row %s is of its commit", last, all[pos+1])
	case !whole && len(next) > 0 && group[string(next[0][3])] != group[last]:
		t.Fatalf("stopped after event %s: not whole, though the next row %s is of the next commit", last, next[0][3])
	}
	return whole
}
