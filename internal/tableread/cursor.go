package tableread

import (
	"context"
	"fmt"
	"math"
	"sync/atomic"

	"github.com/jackc/pgx/v5"

	"github.com/outboxcdc/cdc/internal/pgident"
)

// Cursor reads a plan's rows, a chunk at a time, from one query in one
// snapshot: a server-side cursor over every matching row in the plan's
// order. A plan in the order of the commits has no index to serve a
// keyset chunk, so each chunk would scan and sort the table again; the
// cursor sorts once.
//
// Opened in a transaction (the first start's, in the slot's snapshot; a
// repair's), it reads in that transaction's snapshot. Opened outside one
// (a job beside the stream), it is declared WITH HOLD in a read-only READ
// COMMITTED transaction of its own, whose commit runs the query to its end
// and keeps the rows on the server: the snapshot and the table's lock are
// let go at once, so neither a long job nor a slow Kafka holds back vacuum
// or a migration, and a rewrite that commits while the job runs cannot
// make its snapshot read the table as empty. Its rows are the table as of
// that snapshot: a row changed or deleted since is sent as it was, and one
// committed since is the stream's.
type Cursor struct {
	plan *Plan
	conn *pgx.Conn
	name string
	hold bool
	pos  int64 // rows taken: the cursor stands on row pos
	done bool
	// Horizon is the job's (checkpoint.Job.Horizon): the one it was
	// opened with, or, for a job's first read, the 64-bit xid below which
	// every transaction had ended when the cursor's snapshot was taken.
	Horizon uint64
}

// cursors numbers the cursors, for their names.
var cursors atomic.Int64

// Open opens a cursor over the plan's rows, which must be in an order of
// the commits: every matching row, or, for a job resumed after key after
// with horizon (the job's saved position and Horizon), those after key
// after (from the first row of its transaction: rows of one commit are
// ordered by their command ids and ctids, which are not kept; past it when whole, the job's
// checkpoint.Job.Whole, says the commit was sent whole) and those a
// transaction at or past horizon wrote, wherever they sort. A row updated since the job's first read moved in the order (the
// update gave it its xid, which is at or past the horizon, since the
// updater was still running or not begun then): it is read again, and not
// skipped, wherever it now sorts (at least once, as after any restart).
func (p *Plan) Open(ctx context.Context, conn *pgx.Conn, after []string, horizon uint64, whole bool) (*Cursor, error) {
	if !p.InCommitOrder() {
		return nil, fmt.Errorf("internal: a cursor over %s in the order of columns", p.Table)
	}
	// A name of its own: the first start's transaction reads each table's
	// job from a cursor of its own.
	c := &Cursor{plan: p, conn: conn, name: fmt.Sprintf("cdc_rows_%d", cursors.Add(1)), hold: conn.PgConn().TxStatus() == 'I', Horizon: horizon}
	q, resume := p.rowsQuery(""), after != nil
	var params []any
	if resume {
		if err := p.checkKey(after); err != nil {
			return nil, err
		}
		if horizon == 0 {
			return nil, errorf("backfill of %s: the saved position in commit order has no horizon; start the backfill again", p.Table)
		}
		q = p.rowsQuery(p.resume[0])
		if whole {
			q = p.rowsQuery(p.resume[1])
		}
		for _, v := range after[:p.group] {
			params = append(params, v)
		}
		params = append(params, int64(horizon))
	}
	with := ""
	if c.hold {
		with = " WITH HOLD"
	}
	err := p.readOnly(ctx, conn, func() error {
		if !resume {
			// Before the cursor's snapshot, or in it: a transaction
			// below is over for the snapshot too.
			if err := conn.QueryRow(ctx, `SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint`).Scan(&c.Horizon); err != nil {
				return err
			}
		}
		_, err := conn.Exec(ctx, "DECLARE "+pgident.Ident(c.name)+" SCROLL CURSOR"+with+" FOR "+q, params...)
		return err
	})
	if err != nil {
		return nil, statementError(fmt.Sprintf("backfill of %s: read the rows in commit order", p.Table), err)
	}
	return c, nil
}

// Next reads the next chunk: the plan's chunk size at most, and its byte
// budget (Plan.SetBudget) as Plan.Read keeps it. The rows read past the
// budget are dropped, and the cursor moved back to the last row kept.
func (c *Cursor) Next(ctx context.Context) (Chunk, error) {
	p := c.plan
	if c.done {
		return Chunk{Final: true}, nil
	}
	limit := max(p.limit, 1)
	rr := c.conn.PgConn().ExecParams(ctx, fmt.Sprintf("FETCH FORWARD %d FROM %s", limit, pgident.Ident(c.name)), nil, nil, nil, nil)
	ch, read, cut := p.collect(rr, limit)
	if _, err := rr.Close(); err != nil {
		return Chunk{}, statementError(fmt.Sprintf("backfill of %s: read a chunk", p.Table), err)
	}
	c.pos += int64(len(ch.Rows))
	if read > len(ch.Rows) {
		// Back onto the last row kept: the next chunk starts after it.
		if err := c.moveTo(ctx, c.pos); err != nil {
			return Chunk{}, statementError(fmt.Sprintf("backfill of %s: move the cursor back", p.Table), err)
		}
	}
	ch.Final = !cut && read < limit
	c.done = ch.Final
	return ch, nil
}

// Skip moves the cursor past its first n rows, which were read another
// way (a copy of the same rows in the same order, Plan.CopySQL): Next
// reads on from there.
func (c *Cursor) Skip(ctx context.Context, n int64) error {
	if err := c.moveTo(ctx, n); err != nil {
		return statementError(fmt.Sprintf("backfill of %s: move the cursor past the copy's rows", c.plan.Table), err)
	}
	c.pos = n
	return nil
}

// moveTo puts the cursor on row pos (0: before the first).
func (c *Cursor) moveTo(ctx context.Context, pos int64) error {
	for _, step := range moves(pos) {
		if _, err := c.conn.Exec(ctx, "MOVE "+step+" IN "+pgident.Ident(c.name)); err != nil {
			return err
		}
	}
	return nil
}

// moves are the MOVE steps to row pos: MOVE counts are 32-bit (a count of
// 2^31 is a syntax error), so a position past the last is reached by
// moves forward from there (found by the second attack on the copy).
func moves(pos int64) []string {
	first := min(pos, math.MaxInt32)
	steps := []string{fmt.Sprintf("ABSOLUTE %d", first)}
	for rest := pos - first; rest > 0; rest -= min(rest, math.MaxInt32) {
		steps = append(steps, fmt.Sprintf("FORWARD %d", min(rest, math.MaxInt32)))
	}
	return steps
}

// Close closes the cursor (a WITH HOLD cursor outlives its transaction).
func (c *Cursor) Close(ctx context.Context) {
	if c.hold && !c.conn.IsClosed() {
		_, _ = c.conn.Exec(context.WithoutCancel(ctx), "CLOSE "+pgident.Ident(c.name))
	}
}
