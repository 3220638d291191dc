package copyread_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/outboxcdc/cdc/internal/copyread"
	"github.com/outboxcdc/cdc/internal/postgres"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// TestCopyUnderAnotherClientEncoding: a database whose default
// client_encoding is SJIS, whose characters' second bytes include a
// backslash that COPY's text does not escape, is read in its own
// encoding, UTF-8, by the rows connection (postgres.PinEncoding), as the
// stream is: the copy reads each value as the query does ('表' is 0x95
// 0x5C in SJIS). Found by the attack on the copy.
func TestCopyUnderAnotherClientEncoding(t *testing.T) {
	db := pg.NewDatabase(t)
	testenv.Exec(t, db, `CREATE TABLE t (id int PRIMARY KEY, v text)`,
		`INSERT INTO t VALUES (1, '表'), (2, '表n予定'), (3, 'ソ\t能')`)
	var name string
	testenv.QueryRow(t, db, `SELECT current_database()`, nil, &name)
	testenv.Exec(t, db, `ALTER DATABASE "`+name+`" SET client_encoding = 'SJIS'`)
	ctx := context.Background()
	conn, err := postgres.ConnectRows(ctx, postgres.Config{URL: db}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	const q = `SELECT v FROM public.t ORDER BY id`
	var want [][]byte
	rr := conn.PgConn().ExecParams(ctx, q, nil, nil, nil, nil)
	for rr.NextRow() {
		want = append(want, append([]byte{}, rr.Values()[0]...))
	}
	if _, err := rr.Close(); err != nil {
		t.Fatal(err)
	}
	if string(want[0]) != "表" {
		t.Fatalf("the query read %q, not UTF-8's 表: client_encoding %s", want[0], conn.PgConn().ParameterStatus("client_encoding"))
	}
	r := copyread.Start(ctx, conn.PgConn(), "COPY ("+q+") TO STDOUT", copyread.Options{Width: 1, Rows: 10})
	defer r.Stop()
	rows, _, err := r.Next()
	if err != nil {
		t.Fatalf("the copy failed where the query read %q: %v", want, err)
	}
	if len(rows) != len(want) {
		t.Fatalf("copy read %d rows, the query %d", len(rows), len(want))
	}
	for i := range want {
		if !bytes.Equal(rows[i][0], want[i]) {
			t.Errorf("row %d: copy %q, query %q", i, rows[i][0], want[i])
		}
	}
}
