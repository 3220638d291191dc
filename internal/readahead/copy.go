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
//
// A copy in the cursor's order sorts once where the cursor's query sorts
// twice (tableread.Plan.CopySQL), and flags the commits it cannot order
// as the cursor does: at the first row of one, the copy's rows end, the
// copy is cancelled within its savepoint, and the rows go on from the
// cursor (rest, declared before it and moved past the rows handed out),
// in the same snapshot.
type Copy struct {
	ctx   context.Context
	conn  *pgx.Conn
	table string
	r     *copyread.Reader
	// rest reads on from the cursor past the first n rows, the copy's
	// handed out; then, once the copy reached a flagged row.
	rest  func(n int64) (*Reader, error)
	taken int64
	then  *Reader
}

// StartCopy starts sql, a COPY of table's rows, on conn, in the
// transaction it is in, which it uses until the last rows or Wait. With
// o.Flagged, rest reads on from its first flagged row.
func StartCopy(ctx context.Context, conn *pgx.Conn, table, sql string, o copyread.Options, rest func(n int64) (*Reader, error)) (*Copy, error) {
	// In a savepoint: a copy ended at a flag (copyread.Options.Flagged)
	// is cancelled, which fails what the savepoint holds and no more.
	if _, err := conn.Exec(ctx, "SET LOCAL statement_timeout = 0; SAVEPOINT cdc_copy"); err != nil {
		return nil, fmt.Errorf("backfill of %s: %w", table, err)
	}
	return &Copy{ctx: ctx, conn: conn, table: table, r: copyread.Start(ctx, conn.PgConn(), sql, o), rest: rest}, nil
}

// Next returns the next chunk's rows, and whether they are the last.
// After the last, the statement timeout is on again: another table's
// read may follow in the transaction.
func (c *Copy) Next() (rows [][][]byte, last bool, err error) {
	if c.then != nil {
		return c.then.Next()
	}
	rows, last, err = c.r.Next()
	c.taken += int64(len(rows))
	var first *copyread.FirstRowError
	switch {
	case errors.Is(err, copyread.ErrFlagged) && c.rest != nil:
		if _, err := c.conn.Exec(c.ctx, "ROLLBACK TO SAVEPOINT cdc_copy; SET LOCAL statement_timeout TO DEFAULT"); err != nil {
			return nil, false, fmt.Errorf("backfill of %s: after the copy: %w", c.table, err)
		}
		then, err := c.rest(c.taken)
		if err != nil {
			return nil, false, err
		}
		c.then = then
		return then.Next()
	case errors.As(err, &first):
		return nil, false, fmt.Errorf("backfill of %s: the read in commit order sent no row within backfill.statement_timeout (%s), sorting the rows; raise backfill.statement_timeout, or narrow tables[].backfill.where", c.table, first.After)
	case err != nil:
		return nil, false, fmt.Errorf("backfill of %s: read the rows in commit order: %w", c.table, err)
	case last:
		if _, err := c.conn.Exec(c.ctx, "RELEASE SAVEPOINT cdc_copy; SET LOCAL statement_timeout TO DEFAULT"); err != nil {
			return nil, false, fmt.Errorf("backfill of %s: after the read: %w", c.table, err)
		}
	}
	return rows, last, nil
}

// Pending is the row after the rows Next returned last, which the next
// chunk begins with, when the copy read it (copyread.Reader.Peek): a job
// saved after them is saved whole when they ended a commit.
func (c *Copy) Pending() (rows [][][]byte, last bool) {
	if c.then != nil {
		return c.then.Pending()
	}
	if next := c.r.Peek(); next != nil {
		return [][][]byte{next}, false
	}
	return nil, false
}

// Wait ends the copy, if it still runs, and waits until nothing uses the
// connection: a copy cut short closes it.
func (c *Copy) Wait() {
	c.r.Stop()
	if c.then != nil {
		c.then.Wait()
	}
}
