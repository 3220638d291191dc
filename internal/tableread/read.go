package tableread

import (
	"context"
	"fmt"
	"slices"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxcdc/cdc/internal/pgident"
)

// Count counts the matching rows, for the progress's estimate.
func (p *Plan) Count(ctx context.Context, conn *pgx.Conn) (int64, error) {
	var n int64
	err := p.readOnly(ctx, conn, func() error {
		return conn.QueryRow(ctx, fmt.Sprintf("SELECT count(*) FROM %s WHERE %s", p.from(), p.condition())).Scan(&n)
	})
	if err != nil {
		return 0, statementError(fmt.Sprintf("count the rows to backfill from %s", p.Table), err)
	}
	return n, nil
}

// Chunk is one chunk of rows: each row's column values as text, nil for
// NULL, in Plan.Columns' order.
type Chunk struct {
	Rows [][][]byte
	// Last is the key of the last row, to read the next chunk after; nil
	// when the chunk is empty.
	Last []string
	// Final: the chunk is not full, so no row is left after it.
	Final bool
}

// Last returns the key of the last matching row, or nil when none
// matches: a backfill beside the stream stops there, since the stream
// sends the rows committed after it started.
func (p *Plan) Last(ctx context.Context, conn *pgx.Conn) ([]string, error) {
	var last []string
	err := p.readOnly(ctx, conn, func() error {
		rr := conn.PgConn().ExecParams(ctx, p.last, nil, nil, nil, nil)
		for rr.NextRow() {
			for _, v := range rr.Values() {
				last = append(last, string(v))
			}
		}
		_, err := rr.Close()
		return err
	})
	if err != nil {
		return nil, statementError(fmt.Sprintf("backfill of %s: read the last key", p.Table), err)
	}
	return last, nil
}

// Read reads the chunk after key after (nil: from the first row), up to
// and including key until (nil: to the end), on conn: in the transaction
// conn is in, or in a read-only one of its own (readOnly), which a chunk
// beside the stream takes after its low watermark committed.
func (p *Plan) Read(ctx context.Context, conn *pgx.Conn, after, until []string) (Chunk, error) {
	var params [][]byte
	a, u := 0, 0
	for _, k := range []struct {
		key []string
		set *int
	}{{after, &a}, {until, &u}} {
		if k.key == nil {
			continue
		}
		if err := p.checkKey(k.key); err != nil {
			return Chunk{}, err
		}
		*k.set = 1
		for _, v := range k.key {
			params = append(params, []byte(v))
		}
	}
	q := p.queries[a][u]
	limit := max(p.limit, 1)
	params = append(params, []byte(strconv.Itoa(limit)))
	var c Chunk
	err := p.readOnly(ctx, conn, func() error {
		rr := conn.PgConn().ExecParams(ctx, q, params, nil, nil, nil)
		var cut bool
		c, _, cut = p.collect(rr, limit)
		if _, err := rr.Close(); err != nil {
			return statementError(fmt.Sprintf("backfill of %s: read a chunk", p.Table), err)
		}
		c.Final = !cut && len(c.Rows) < limit
		return nil
	})
	if err != nil {
		return Chunk{}, err
	}
	return c, nil
}

// collect reads the rows of a chunk's result rr, which asked for limit
// rows, until the plan's byte budget: read is how many rows came, and cut
// whether some were dropped past the budget. It adjusts the plan's limit
// to the rows' size and sets the chunk's Last.
func (p *Plan) collect(rr *pgconn.ResultReader, limit int) (c Chunk, read int, cut bool) {
	var bytes int64
	// The rows' value slices, cut from one allocation for the chunk: a
	// row's slice is held only while its chunk is (what an event keeps
	// is the row's bytes, an allocation of each row's own).
	var heads [][]byte
	for rr.NextRow() {
		read++
		if cut {
			continue // past the budget: read off the wire, not kept
		}
		src := rr.Values()
		if len(heads) < len(src) {
			heads = make([][]byte, max(limit-len(c.Rows), 1)*len(src))
		}
		row := heads[:len(src):len(src)]
		heads = heads[len(src):]
		size := 0
		for _, v := range src {
			size += len(v)
		}
		bytes += int64(size)
		buf := make([]byte, 0, size) // one allocation for the row's values
		for i, v := range src {
			if v != nil {
				start := len(buf)
				buf = append(buf, v...)
				row[i] = buf[start:len(buf):len(buf)]
			}
		}
		c.Rows = append(c.Rows, row)
		// A row larger than the budget is read alone; a chunk ends at
		// the row that reaches it.
		cut = p.budget > 0 && bytes >= p.budget && len(c.Rows) < limit
	}
	switch {
	case cut:
		p.limit = len(c.Rows) // what fits
	case p.budget > 0 && len(c.Rows) == limit && bytes*2 <= p.budget:
		p.limit = min(2*limit, p.most) // room for more
	}
	if n := len(c.Rows); n > 0 {
		c.Last = p.KeyOf(c.Rows[n-1])
	}
	return c, read, cut
}

// CommitBefore reports whether row a of p's chunk committed before row b
// of q's, of another table read in the same order of the commits
// (InCommitOrder, the same Order): by the terms that name a commit (the
// transaction's id, or its commit timestamp), which compare across
// tables. Rows of one commit compare equal, either way.
func (p *Plan) CommitBefore(a [][]byte, q *Plan, b [][]byte) bool {
	for i := 0; i < p.group && i < q.group; i++ {
		x, _ := strconv.ParseInt(string(a[p.keyAt+i]), 10, 64)
		y, _ := strconv.ParseInt(string(b[q.keyAt+i]), 10, 64)
		if x != y {
			return x < y
		}
	}
	return false
}

// KeyOf is the key of row, one of a Chunk's rows: a read after it starts
// with the row after it.
func (p *Plan) KeyOf(row [][]byte) []string {
	key := make([]string, len(row)-p.keyAt)
	for i, v := range row[p.keyAt:] {
		key[i] = string(v)
	}
	return key
}

// Whole reports whether every row of the commit of after (a key KeyOf
// made) was read, next being the rows read after it and final whether
// they are the last: in an order of the commits, the next row is of a
// later commit. A job saved so resumes past that commit (Open's whole):
// reading it again would send again an event a redrive dropped.
func (p *Plan) Whole(after []string, next [][][]byte, final bool) bool {
	switch {
	case p.group == 0 || len(after) < p.group:
		return false
	case len(next) == 0:
		return final
	}
	return !slices.Equal(after[:p.group], p.KeyOf(next[0])[:p.group])
}

// readOnly runs fn in a read-only transaction, unless conn is in a
// transaction already (a snapshot's, both read-only): a condition can then
// write nothing. The transaction runs as backfill.reader_role, when set,
// and what a condition may have set for the session (set_config with
// is_local false is refused by sqlwhere.Check, but the session outlives
// it) is reset after it: conn serves the next chunk too. READ COMMITTED
// whatever default_transaction_isolation says: each statement then takes
// its snapshot after the locks it waited for, so a chunk that waited
// behind a rewrite reads the rewritten table; in REPEATABLE READ its
// snapshot would be from before the rewrite, and read the table as empty
// (a last, empty chunk: the job would end without a word).
func (p *Plan) readOnly(ctx context.Context, conn *pgx.Conn, fn func() error) error {
	if conn.PgConn().TxStatus() != 'I' {
		return fn()
	}
	if _, err := conn.Exec(ctx, "BEGIN ISOLATION LEVEL READ COMMITTED READ ONLY"); err != nil {
		return err
	}
	err := SetRole(ctx, conn, p.Role)
	if err == nil {
		err = fn()
	}
	if err != nil {
		_, _ = conn.Exec(context.WithoutCancel(ctx), "ROLLBACK")
		_, _ = conn.Exec(context.WithoutCancel(ctx), "RESET ALL")
		return err
	}
	if _, err := conn.Exec(ctx, "COMMIT"); err != nil {
		return err
	}
	_, err = conn.Exec(ctx, "RESET ALL")
	return err
}

// SetRole makes the transaction on conn run as role (SET LOCAL ROLE),
// when one is set: backfill.reader_role. A snapshot's transaction, which
// its reads run in, sets it once it began.
func SetRole(ctx context.Context, conn *pgx.Conn, role string) error {
	if role == "" {
		return nil
	}
	if _, err := conn.Exec(ctx, "SET LOCAL ROLE "+pgident.Ident(role)); err != nil {
		return &Error{Msg: fmt.Sprintf("backfill.reader_role %s: %s; create it, grant it SELECT on the outbox tables, and make the connector's role a member: GRANT %s TO <the connector's role>", pgident.Quote(role), pgMessage(err), pgident.Quote(role))}
	}
	return nil
}
