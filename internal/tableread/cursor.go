package tableread

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

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
	// byTID: the cursor holds each row's key and place only, and Next
	// reads the rows by their places (Plan.byTID), in the snapshot the
	// cursor was opened in; a WITH HOLD cursor outlives it, and a place
	// in a later snapshot may hold another row, so it holds the rows.
	byTID bool
	pos   int64 // rows taken: the cursor stands on row pos
	done  bool
	// failed is a read by place that did not find its rows: the cursor
	// stands past rows it did not return, and is not read again (a
	// caller opens another, in a new snapshot).
	failed error
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
	c.byTID = p.byTID && !c.hold
	if c.byTID {
		// Its reads by place must see the cursor's snapshot: in READ
		// COMMITTED each would take a newer one.
		var iso string
		if err := conn.QueryRow(ctx, "SHOW transaction_isolation").Scan(&iso); err != nil {
			return nil, statementError(fmt.Sprintf("backfill of %s: read the transaction's isolation", p.Table), err)
		}
		c.byTID = iso == "repeatable read" || iso == "serializable"
	}
	query := p.rowsQuery
	if c.byTID {
		query = p.keyRowsQuery
	}
	q, resume := query(""), after != nil
	var params []any
	if resume {
		if err := p.checkKey(after); err != nil {
			return nil, err
		}
		if horizon == 0 {
			return nil, errorf("backfill of %s: the saved position in commit order has no horizon; start the backfill again", p.Table)
		}
		q = query(p.resume[0])
		if whole {
			q = query(p.resume[1])
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
	switch {
	case c.failed != nil:
		return Chunk{}, c.failed
	case c.done:
		return Chunk{Final: true}, nil
	}
	for {
		limit := max(p.limit, 1)
		rr := c.conn.PgConn().ExecParams(ctx, fmt.Sprintf("FETCH FORWARD %d FROM %s", limit, pgident.Ident(c.name)), nil, nil, nil, nil)
		var ch Chunk
		var read int
		var cut, over bool
		if c.byTID {
			var err error
			if ch, read, cut, over, err = c.byPlace(ctx, rr, limit); err != nil {
				var stmt *stmtError
				if !errors.As(err, &stmt) {
					c.failed = err
				}
				return Chunk{}, err
			}
		} else {
			ch, read, cut = p.collect(rr, limit)
			if _, err := rr.Close(); err != nil {
				return Chunk{}, statementError(fmt.Sprintf("backfill of %s: read a chunk", p.Table), err)
			}
		}
		c.pos += int64(len(ch.Rows))
		if read > len(ch.Rows) {
			// Back onto the last row kept: the next chunk starts after it.
			if _, err := c.conn.Exec(ctx, fmt.Sprintf("MOVE ABSOLUTE %d IN %s", c.pos, pgident.Ident(c.name))); err != nil {
				return Chunk{}, statementError(fmt.Sprintf("backfill of %s: move the cursor back", p.Table), err)
			}
		}
		if over {
			continue // fewer rows, from the same one
		}
		ch.Final = !cut && read < limit
		c.done = ch.Final
		return ch, nil
	}
}

// byPlace reads the chunk of a cursor of keys and places (Cursor.byTID):
// rr, which asked for limit rows, gives each row's key terms, its ctid
// and its tableoid, in the plan's order; the rows are then read by their
// places, in the same snapshot, and kept in that order within the plan's
// budget, as collect keeps them. They come in the order of their places,
// not the chunk's, so that the budget is kept while they come: once the
// rows held reach it with more to come, the chunk is dropped (over) and
// the plan's limit lowered below what was held, to read again from the
// same row; a single row is always read whole. A row of the list not
// where it lay, or two at one place, is an error, never a row skipped or
// sent twice: in one snapshot, with the table locked against a rewrite,
// it cannot happen.
func (c *Cursor) byPlace(ctx context.Context, rr *pgconn.ResultReader, limit int) (ch Chunk, read int, cut, over bool, err error) {
	p := c.plan
	n := len(p.terms)
	var keys [][][]byte // each row's key values, in the order
	at := map[place]int{}
	var tids strings.Builder
	tids.WriteByte('{')
	var bad error
	for rr.NextRow() {
		v := rr.Values()
		if bad != nil {
			continue
		}
		size := 0
		for _, k := range v[:n] {
			size += len(k)
		}
		buf, key := make([]byte, 0, size), make([][]byte, n)
		for i, k := range v[:n] {
			start := len(buf)
			buf = append(buf, k...)
			key[i] = buf[start:len(buf):len(buf)]
		}
		pl, ok := parsePlace(v[n], v[n+1])
		if _, twice := at[pl]; !ok || twice {
			bad = fmt.Errorf("backfill of %s: the cursor gave the place %q in table %q twice or not as a ctid; the backfill reads it again in a new snapshot", p.Table, v[n], v[n+1])
			continue
		}
		at[pl] = len(keys)
		keys = append(keys, key)
		if len(keys) > 1 {
			tids.WriteByte(',')
		}
		tids.WriteByte('"')
		tids.Write(v[n]) // (block,offset): no quote or backslash
		tids.WriteByte('"')
	}
	if _, err := rr.Close(); err != nil {
		return Chunk{}, 0, false, false, statementError(fmt.Sprintf("backfill of %s: read a chunk", p.Table), err)
	}
	if bad != nil {
		return Chunk{}, 0, false, false, bad
	}
	read = len(keys)
	k := keeper{p: p, limit: limit}
	if read == 0 {
		ch, cut = k.chunk()
		return ch, 0, cut, false, nil
	}
	tids.WriteByte('}')
	rows, sizes := make([][][]byte, read), make([]int, read)
	held, bytes := 0, int64(0)
	rr = c.conn.PgConn().ExecParams(ctx, p.fetch, [][]byte{[]byte(tids.String())}, nil, nil, nil)
	for rr.NextRow() {
		if over {
			continue // read off the wire, not kept
		}
		v := rr.Values()
		pl, ok := parsePlace(v[p.keyAt+1], v[p.keyAt])
		i, listed := at[pl]
		if !ok || !listed || rows[i] != nil {
			continue // not the table's own row (the plan reads none but its own)
		}
		size := 0
		for _, x := range v[:p.keyAt] {
			size += len(x)
		}
		for _, x := range keys[i] {
			size += len(x)
		}
		buf, row := make([]byte, 0, size), make([][]byte, p.keyAt+n)
		for j, x := range v[:p.keyAt] {
			if x != nil {
				start := len(buf)
				buf = append(buf, x...)
				row[j] = buf[start:len(buf):len(buf)]
			}
		}
		for j, x := range keys[i] {
			start := len(buf)
			buf = append(buf, x...)
			row[p.keyAt+j] = buf[start:len(buf):len(buf)]
		}
		rows[i], sizes[i] = row, size
		held++
		bytes += int64(size)
		if p.budget > 0 && bytes >= p.budget && held < read {
			over = true
			rows = nil // let go of what was held
		}
	}
	if _, err := rr.Close(); err != nil {
		return Chunk{}, 0, false, false, statementError(fmt.Sprintf("backfill of %s: read a chunk's rows", p.Table), err)
	}
	if over {
		// None kept: the cursor goes back to the chunk's first row, and
		// the next try asks for fewer than were held when the budget was
		// reached.
		p.limit = max(1, min(held-1, limit/2))
		return Chunk{}, read, false, true, nil
	}
	for i, row := range rows {
		if row == nil {
			return Chunk{}, 0, false, false, fmt.Errorf("backfill of %s: a row the cursor listed was not at its place (ctid) in the same snapshot; the backfill reads it again in a new snapshot", p.Table)
		}
		k.keep(row, sizes[i])
	}
	ch, cut = k.chunk()
	return ch, read, cut, false, nil
}

// place is where a row lies: its table's oid and its ctid.
type place struct {
	table  uint32
	block  uint32
	offset uint16
}

// parsePlace parses a ctid's and a tableoid's text, "(block,offset)" and
// an oid, without an allocation: it runs twice a row.
func parsePlace(ctid, oid []byte) (place, bool) {
	t, ok := digits(oid, 1<<32-1)
	if !ok || len(ctid) < 5 || ctid[0] != '(' || ctid[len(ctid)-1] != ')' {
		return place{}, false
	}
	inner := ctid[1 : len(ctid)-1]
	comma := slices.Index(inner, ',')
	if comma < 0 {
		return place{}, false
	}
	blk, ok1 := digits(inner[:comma], 1<<32-1)
	off, ok2 := digits(inner[comma+1:], 1<<16-1)
	return place{uint32(t), uint32(blk), uint16(off)}, ok1 && ok2
}

// digits is the decimal number b, at most limit.
func digits(b []byte, limit uint64) (uint64, bool) {
	if len(b) == 0 || len(b) > 10 {
		return 0, false
	}
	var n uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + uint64(c-'0')
	}
	return n, n <= limit
}

// Close closes the cursor (a WITH HOLD cursor outlives its transaction).
func (c *Cursor) Close(ctx context.Context) {
	if c.hold && !c.conn.IsClosed() {
		_, _ = c.conn.Exec(context.WithoutCancel(ctx), "CLOSE "+pgident.Ident(c.name))
	}
}
