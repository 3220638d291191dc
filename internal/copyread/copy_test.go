package copyread_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxcdc/cdc/internal/copyread"
	"github.com/outboxcdc/cdc/internal/postgres"
	"github.com/outboxcdc/cdc/internal/testenv"
)

var pg *testenv.Postgres

func TestMain(m *testing.M) { testenv.Main(m, &pg) }

// TestCopyReadsWhatAQueryReads: a generated table of the values COPY
// escapes (tabs, newlines, carriage returns, backslashes, control
// characters, text that reads \N, empty strings beside NULLs, non-ASCII,
// bytea, jsonb with escapes, a 2 MB value) read by copy, in batches of
// any size and budget, gives the rows of the same query read in text
// format, in its order, value for value.
func TestCopyReadsWhatAQueryReads(t *testing.T) {
	db := pg.NewDatabase(t)
	testenv.Exec(t, db, `CREATE TABLE hostile (id int PRIMARY KEY, t text, b bytea, j jsonb, ts timestamptz, n numeric)`)
	ctx := context.Background()
	w := testenv.Connect(t, db)
	rng := rand.New(rand.NewPCG(7, 56))
	pieces := []string{"a", "\t", "\n", "\r", "\\", `\N`, "\x01", "\x1f", "\b", "\f", "\v", "é", "日本", `"`, "'", " ", "N", "\\t"}
	for i := range 400 {
		var s strings.Builder
		for range rng.IntN(30) {
			s.WriteString(pieces[rng.IntN(len(pieces))])
		}
		text := any(s.String())
		switch rng.IntN(6) {
		case 0:
			text = nil
		case 1:
			text = ""
		}
		if i == 200 {
			text = strings.Repeat("big\t\\\n", 2<<20/6)
		}
		if _, err := w.Exec(ctx, `INSERT INTO hostile VALUES ($1::int, $2::text, convert_to(coalesce($2::text, ''), 'UTF8'), CASE WHEN $2::text IS NULL THEN NULL ELSE jsonb_build_object('v', $2::text) END, now() - $1::int * interval '1 hour', $1::int / 7.0)`, i, text); err != nil {
			t.Fatal(err)
		}
	}
	conn, err := postgres.ConnectRows(ctx, postgres.Config{URL: db}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	const query = `SELECT id, t, b, j, ts, n, '' AS empty, NULL::text AS null FROM public.hostile ORDER BY id`
	var want [][][]byte
	rr := conn.PgConn().ExecParams(ctx, query, nil, nil, nil, nil)
	for rr.NextRow() {
		row := make([][]byte, len(rr.Values()))
		for i, v := range rr.Values() {
			if v != nil {
				row[i] = append([]byte{}, v...)
			}
		}
		want = append(want, row)
	}
	if _, err := rr.Close(); err != nil {
		t.Fatal(err)
	}
	for _, o := range []copyread.Options{{Rows: 1}, {Rows: 7}, {Rows: 1000}, {Rows: 50, Budget: 300}, {Rows: 1000, Budget: 1}} {
		t.Run(fmt.Sprintf("rows %d budget %d", o.Rows, o.Budget), func(t *testing.T) {
			o.Width = 8
			r := copyread.Start(ctx, conn.PgConn(), "COPY ("+query+") TO STDOUT", o)
			defer r.Stop()
			var got [][][]byte
			for {
				rows, last, err := r.Next()
				if err != nil {
					t.Fatal(err)
				}
				if len(rows) > o.Rows {
					t.Fatalf("a batch of %d rows, more than %d", len(rows), o.Rows)
				}
				got = append(got, rows...)
				if last {
					break
				}
			}
			if len(got) != len(want) {
				t.Fatalf("copy read %d rows, the query %d", len(got), len(want))
			}
			for i := range want {
				for k := range want[i] {
					if (got[i][k] == nil) != (want[i][k] == nil) || !bytes.Equal(got[i][k], want[i][k]) {
						t.Fatalf("row %d value %d: copy read %.80q (nil %v), the query %.80q (nil %v)", i, k, got[i][k], got[i][k] == nil, want[i][k], want[i][k] == nil)
					}
				}
			}
			// The copy ended: the connection serves the next statement.
			if err := conn.Ping(ctx); err != nil {
				t.Fatalf("after the copy: %v", err)
			}
		})
	}
}

// TestCopyEnds: a copy stopped part-way leaves no goroutine on the
// connection, which is closed; the server's error comes after the rows
// before it; a copy that sends no row within FirstRow is cancelled with
// a FirstRowError, and one slower than that between rows is not.
func TestCopyEnds(t *testing.T) {
	db := pg.NewDatabase(t)
	ctx := context.Background()
	connect := func() *pgconn.PgConn {
		conn, err := postgres.ConnectRows(ctx, postgres.Config{URL: db}, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close(ctx) })
		return conn.PgConn()
	}
	t.Run("stopped", func(t *testing.T) {
		conn := connect()
		r := copyread.Start(ctx, conn, `COPY (SELECT repeat('x', 1000) FROM generate_series(1, 10000000)) TO STDOUT`, copyread.Options{Width: 1, Rows: 10})
		if rows, _, err := r.Next(); err != nil || len(rows) != 10 {
			t.Fatalf("first batch: %d rows, %v", len(rows), err)
		}
		r.Stop()
		if !conn.IsClosed() {
			t.Fatal("a copy stopped part-way left its connection open, in the middle of the copy")
		}
		if _, _, err := r.Next(); err == nil {
			t.Fatal("Next after Stop: no error")
		}
	})
	t.Run("server error", func(t *testing.T) {
		r := copyread.Start(ctx, connect(), `COPY (SELECT 10 / (5 - i) FROM generate_series(1, 10) i) TO STDOUT`, copyread.Options{Width: 1, Rows: 3})
		defer r.Stop()
		var got []string
		var err error
		for {
			var rows [][][]byte
			var last bool
			rows, last, err = r.Next()
			for _, row := range rows {
				got = append(got, string(row[0]))
			}
			if err != nil || last {
				break
			}
		}
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "22012" {
			t.Fatalf("error %v, want division by zero", err)
		}
		if strings.Join(got, ",") != "2,3,5" && strings.Join(got, ",") != "2,3,5,10" {
			t.Fatalf("rows before the error: %v", got)
		}
	})
	t.Run("no first row", func(t *testing.T) {
		r := copyread.Start(ctx, connect(), `COPY (SELECT pg_sleep(600)) TO STDOUT`, copyread.Options{Width: 1, Rows: 3, FirstRow: 200 * time.Millisecond})
		defer r.Stop()
		_, _, err := r.Next()
		var first *copyread.FirstRowError
		if !errors.As(err, &first) || first.After != 200*time.Millisecond {
			t.Fatalf("error %v, want a FirstRowError after 200ms", err)
		}
	})
	t.Run("slow between rows", func(t *testing.T) {
		// The server sends its rows 8 kB at a time: the pause comes
		// after the first 100 kB.
		r := copyread.Start(ctx, connect(), `COPY (SELECT repeat('x', 1000), pg_sleep(CASE WHEN i = 150 THEN 0.5 ELSE 0 END) FROM generate_series(1, 200) i) TO STDOUT`, copyread.Options{Width: 2, Rows: 1, FirstRow: 200 * time.Millisecond})
		defer r.Stop()
		n := 0
		for {
			rows, last, err := r.Next()
			if err != nil {
				t.Fatalf("after %d rows: %v", n, err)
			}
			n += len(rows)
			if last {
				break
			}
		}
		if n != 200 {
			t.Fatalf("%d rows, want 200", n)
		}
	})
}

// TestCopyEndsAtTheFlag: a copy whose rows are flagged (Options.Flagged)
// hands out the rows before the first flagged one, then ErrFlagged, as
// soon as the server ends the copy it was asked to end, not once it sent
// every row after (here 2 s of them, 100 ms a row; found by the attack on
// the flag); the row is shown by Peek; and the transaction, rolled back
// to the copy's savepoint, goes on in its snapshot with a cursor declared
// before it. Flagged at the first row, at a later one, or at none.
func TestCopyEndsAtTheFlag(t *testing.T) {
	db := pg.NewDatabase(t)
	ctx := context.Background()
	for _, at := range []int{1, 4, 0} {
		t.Run(fmt.Sprint("flag at ", at), func(t *testing.T) {
			conn, err := postgres.ConnectRows(ctx, postgres.Config{URL: db}, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			for _, q := range []string{"BEGIN ISOLATION LEVEL REPEATABLE READ", "DECLARE c SCROLL CURSOR FOR SELECT i FROM generate_series(1, 3) i", "SAVEPOINT copy"} {
				if _, err := conn.Exec(ctx, q); err != nil {
					t.Fatal(err)
				}
			}
			rows := 21
			if at == 0 {
				rows = 5 // all sent: no need to wait for the slow rows
			}
			// Rows of 9 kB: COPY sends what it has when 8 kB are
			// written, so each row reaches the client as it is read.
			sql := fmt.Sprintf(`COPY (SELECT i, repeat('x', 9000), i = %d FROM generate_series(1, %d) i, LATERAL (SELECT CASE WHEN i > %d THEN pg_sleep(0.1) END) s) TO STDOUT`, at, rows, max(at, 5))
			started := time.Now()
			r := copyread.Start(ctx, conn.PgConn(), sql, copyread.Options{Width: 2, Rows: 2, Flagged: true})
			defer r.Stop()
			var got []string
			for {
				batch, last, err := r.Next()
				for _, row := range batch {
					got = append(got, string(row[0]))
				}
				if at == 0 && last {
					break
				}
				if at > 0 && errors.Is(err, copyread.ErrFlagged) {
					if p := r.Peek(); len(p) != 2 || string(p[0]) != fmt.Sprint(at) {
						t.Fatalf("ended at the flag with the row after %q, want the flagged row %d", p, at)
					}
					break
				}
				if err != nil || last {
					t.Fatalf("got %v, last %v, err %v; want the rows before row %d, then ErrFlagged", got, last, err, at)
				}
			}
			want := min(at-1, rows)
			if at == 0 {
				want = rows
			}
			if len(got) != want || want > 0 && got[len(got)-1] != fmt.Sprint(want) {
				t.Fatalf("handed out %v; want rows 1 to %d", got, want)
			}
			if took := time.Since(started); at > 0 && took > time.Second {
				t.Fatalf("the flag at row %d ended the copy after %s: the server sent the rows after it (2 s of them)", at, took.Round(time.Millisecond))
			}
			var n int
			if _, err := conn.Exec(ctx, "ROLLBACK TO SAVEPOINT copy"); err != nil {
				t.Fatal(err)
			}
			if err := conn.QueryRow(ctx, "FETCH 1 FROM c").Scan(&n); err != nil || n != 1 {
				t.Fatalf("the cursor declared before the copy, after it: %d, %v", n, err)
			}
		})
	}
}
