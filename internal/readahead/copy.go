package readahead

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/outboxcdc/cdc/internal/copyread"
)

// Copy is a table's rows read by one COPY ... TO STDOUT (package
// copyread), handed out as a Reader's are: the copy fills the next
// chunk while one is held, then waits, and the server with it through
// TCP. A first start's read of a table alone from its first row: the
// same rows as its cursor, without a FETCH a chunk nor the scrollable
// copy a cursor keeps (docs/benchmarks.md, "A copy for the first
// start"). The copy is one statement, which runs as long as its rows take
// to send: the statement timeout would end a long backfill, so it is off
// while the copy runs, and the timeout bounds the wait for the first row
// instead, the sort a cursor's first FETCH waits for.
type Copy struct {
	ctx   context.Context
	conn  *pgx.Conn
	table string
	r     *copyread.Reader
}

// StartCopy starts sql, a COPY of table's rows, on conn, in the
// transaction it is in, which it uses until the last rows or Wait.
func StartCopy(ctx context.Context, conn *pgx.Conn, table, sql string, o copyread.Options) (*Copy, error) {
	if _, err := conn.Exec(ctx, "SET LOCAL statement_timeout = 0"); err != nil {
		return nil, fmt.Errorf("backfill of %s: %w", table, err)
	}
	return &Copy{ctx: ctx, conn: conn, table: table, r: copyread.Start(ctx, conn.PgConn(), sql, o)}, nil
}

// Next returns the next chunk's rows, and whether they are the last.
// After the last, the statement timeout is on again: another table's
// read may follow in the transaction.
func (c *Copy) Next() (rows [][][]byte, last bool, err error) {
	rows, last, err = c.r.Next()
	var first *copyread.FirstRowError
	switch {
	case errors.As(err, &first):
		return nil, false, fmt.Errorf("backfill of %s: the read in commit order sent no row within backfill.statement_timeout (%s), sorting the rows; raise backfill.statement_timeout, or narrow tables[].backfill.where", c.table, first.After)
	case err != nil:
		return nil, false, fmt.Errorf("backfill of %s: read the rows in commit order: %w", c.table, err)
	case last:
		if _, err := c.conn.Exec(c.ctx, "SET LOCAL statement_timeout TO DEFAULT"); err != nil {
			return nil, false, fmt.Errorf("backfill of %s: after the read: %w", c.table, err)
		}
	}
	return rows, last, nil
}

// Pending is the row after the rows Next returned last, which the next
// chunk begins with, when the copy read it (copyread.Reader.Peek): a job
// saved after them is saved whole when they ended a commit.
func (c *Copy) Pending() (rows [][][]byte, last bool) {
	if next := c.r.Peek(); next != nil {
		return [][][]byte{next}, false
	}
	return nil, false
}

// Wait ends the copy, if it still runs, and waits until nothing uses the
// connection: a copy cut short closes it.
func (c *Copy) Wait() { c.r.Stop() }
