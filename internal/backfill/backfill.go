package backfill

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxcdc/cdc/internal/decode"
	"github.com/outboxcdc/cdc/internal/errtext"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/pgident"
	"github.com/outboxcdc/cdc/internal/sqlwhere"
)

// Plan is how to read one table's matching rows in chunks.
type Plan struct {
	Table *outbox.Source
	Where string
	// Key lists the key columns, order_by's then the primary key's.
	Key []string
	// queries are the chunk queries, by whether they have a key to start
	// after and a key to stop at; Columns are their result columns.
	queries [2][2]string
	last    string // the query of the last key
	Columns []decode.Column
	keyAt   int // index of the first key column in a row
	chunk   int
	role    string // backfill.reader_role: what the condition runs as
	// budget bounds a chunk's bytes (SetBudget): rows are read until it
	// is reached, and limit, the rows the next query asks for, follows
	// the rows' size: it grows from firstLimit while chunks fit, up to
	// chunk, and shrinks to what fit when one did not.
	budget int64
	limit  int
}

// firstLimit is the rows a plan's first chunk asks for, before it knows
// how large rows are: small enough that a table of large rows does not
// send much more than the budget for the reader to drop.
const firstLimit = 64

// SetBudget bounds each chunk Read returns to about n bytes of row values (0:
// no bound); a single row larger than n is read alone. Memory then holds a
// chunk of n bytes, however large the rows (docs/design.md, "Memory is bounded
// in bytes").
func (p *Plan) SetBudget(n int64) {
	p.budget = n
	p.limit = min(p.chunk, firstLimit)
	if n == 0 {
		p.limit = p.chunk
	}
}

// Error is a problem with a backfill's configuration or condition that the
// operator must fix: the condition does not parse, a column does not
// exist, or the table has no usable key.
type Error struct{ Msg string }

func (e *Error) Error() string { return e.Msg }

func errorf(format string, args ...any) error { return &Error{Msg: fmt.Sprintf(format, args...)} }

// NewPlan works out the key and the queries of a backfill of t's rows
// matching where ("" for all), ordered by orderBy (catalog names; nil for
// the primary key), and has the server check them. conn must be a
// postgres.ConnectRows connection.
func NewPlan(ctx context.Context, conn *pgx.Conn, t *outbox.Source, where string, orderBy []string, chunk int) (*Plan, error) {
	cols, pk, err := readColumns(ctx, conn, t)
	if err != nil {
		return nil, err
	}
	var key []string
	seen := map[string]bool{}
	for _, name := range append(append([]string(nil), orderBy...), pk...) {
		if seen[name] {
			continue
		}
		seen[name] = true
		c, ok := cols[name]
		if !ok {
			return nil, errorf("backfill.order_by of %s: no column %s; name existing columns, such as the primary key (%s)", t, pgident.Quote(name), quoteAll(pk))
		}
		if !c.notNull {
			return nil, errorf("backfill.order_by of %s: column %s can be NULL, and rows where it is would be skipped; order by NOT NULL columns such as the primary key (%s), or run ALTER TABLE %s ALTER COLUMN %s SET NOT NULL", t, pgident.Quote(name), quoteAll(pk), t, pgident.Quote(name))
		}
		key = append(key, name)
	}
	if err := sqlwhere.Check(strings.TrimSpace(where)); err != nil {
		return nil, errorf("backfill of %s: %v", t, err)
	}
	p := &Plan{Table: t, Where: strings.TrimSpace(where), Key: key, chunk: chunk, limit: chunk}
	p.build(cols)
	if err := p.prepare(ctx, conn); err != nil {
		return nil, err
	}
	return p, nil
}

// column is a table's column, as a plan needs it.
type column struct {
	name, typ string
	notNull   bool
}

// readColumns reads t's columns, by name, and its primary key, which a
// backfill needs.
func readColumns(ctx context.Context, conn *pgx.Conn, t *outbox.Source) (map[string]column, []string, error) {
	cols := map[string]column{}
	rows, err := conn.Query(ctx, `
		SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull
		FROM pg_attribute a WHERE a.attrelid = $1::regclass AND a.attnum > 0 AND NOT a.attisdropped`, t.Name.String())
	if err != nil {
		return nil, nil, errorf("backfill of %s: %v", t, errtext.OneLine(err))
	}
	for rows.Next() {
		var c column
		if err := rows.Scan(&c.name, &c.typ, &c.notNull); err != nil {
			return nil, nil, fmt.Errorf("read the columns of %s: %w", t, err)
		}
		cols[c.name] = c
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("read the columns of %s: %w", t, err)
	}
	pkRows, err := conn.Query(ctx, `
		SELECT a.attname FROM pg_index i
		JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) ON true
		JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
		WHERE i.indrelid = $1::regclass AND i.indisprimary ORDER BY k.ord`, t.Name.String())
	if err != nil {
		return nil, nil, fmt.Errorf("read the primary key of %s: %w", t, err)
	}
	pk, err := pgx.CollectRows(pkRows, pgx.RowTo[string])
	if err != nil {
		return nil, nil, fmt.Errorf("read the primary key of %s: %w", t, err)
	}
	if len(pk) == 0 {
		return nil, nil, errorf("backfill of %s: the table has no primary key, which a backfill needs to read it in chunks without skipping or repeating a row; add one", t)
	}
	return cols, pk, nil
}

// build writes the plan's queries: a chunk after and up to given keys,
// and the last key.
func (p *Plan) build(cols map[string]column) {
	t, key := p.Table, p.Key
	var sel []string
	for _, c := range t.Needed() {
		sel = append(sel, pgident.Ident(c))
	}
	p.keyAt = len(sel)
	var keyList, desc []string
	params := func(from int) string {
		var ps []string
		for i, k := range key {
			ps = append(ps, fmt.Sprintf("CAST($%d AS %s)", from+i, cols[k].typ))
		}
		return strings.Join(ps, ", ")
	}
	for _, k := range key {
		sel = append(sel, pgident.Ident(k))
		keyList = append(keyList, pgident.Ident(k))
		desc = append(desc, pgident.Ident(k)+" DESC")
	}
	cond, from := p.condition(), p.from()
	keys := "(" + strings.Join(keyList, ", ") + ")"
	for after := 0; after < 2; after++ {
		for until := 0; until < 2; until++ {
			q := fmt.Sprintf("SELECT %s FROM %s WHERE %s", strings.Join(sel, ", "), from, cond)
			n := 1
			if after == 1 {
				q += fmt.Sprintf(" AND %s > (%s)", keys, params(n))
				n += len(key)
			}
			if until == 1 {
				q += fmt.Sprintf(" AND %s <= (%s)", keys, params(n))
				n += len(key)
			}
			// The limit is the last parameter: it follows the rows' size.
			p.queries[after][until] = q + fmt.Sprintf(" ORDER BY %s LIMIT $%d", strings.Join(keyList, ", "), n)
		}
	}
	p.last = fmt.Sprintf("SELECT %s FROM %s WHERE %s ORDER BY %s LIMIT 1", strings.Join(keyList, ", "), from, cond, strings.Join(desc, ", "))
}

// prepare has the server parse the queries: a bad condition fails here,
// before anything is sent. It reads the columns a chunk returns.
func (p *Plan) prepare(ctx context.Context, conn *pgx.Conn) error {
	t := p.Table
	for i, q := range []string{p.queries[0][0], p.queries[1][1], p.last} {
		sd, err := conn.Prepare(ctx, "", q)
		if err != nil {
			return errorf("backfill of %s: the condition %q does not work: %s; fix backfill.where (or --where)", t, p.Where, pgMessage(err))
		}
		if i == 0 {
			for _, f := range sd.Fields {
				p.Columns = append(p.Columns, decode.Column{Name: f.Name, TypeOID: f.DataTypeOID})
			}
		}
	}
	if _, err := decode.NewRowDecoder(t, p.Columns); err != nil {
		return errorf("backfill of %s: %v", t, err)
	}
	return nil
}

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
// and including key until (nil: to the end), on conn, in whatever
// transaction conn is in.
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
		if len(k.key) != len(p.Key) {
			return Chunk{}, fmt.Errorf("backfill of %s: the saved position has %d key values, the key has %d columns (%s); was order_by changed? start the backfill again", p.Table, len(k.key), len(p.Key), strings.Join(p.Key, ", "))
		}
		*k.set = 1
		for _, v := range k.key {
			params = append(params, []byte(v))
		}
	}
	q := p.queries[a][u]
	limit := max(p.limit, 1)
	params = append(params, []byte(strconv.Itoa(limit)))
	rr := conn.PgConn().ExecParams(ctx, q, params, nil, nil, nil)
	var c Chunk
	var bytes int64
	cut := false
	for rr.NextRow() {
		if cut {
			continue // past the budget: read off the wire, not kept
		}
		src := rr.Values()
		row := make([][]byte, len(src))
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
	if _, err := rr.Close(); err != nil {
		return Chunk{}, statementError(fmt.Sprintf("backfill of %s: read a chunk", p.Table), err)
	}
	switch {
	case cut:
		p.limit = len(c.Rows) // what fits
	case p.budget > 0 && len(c.Rows) == limit && bytes*2 <= p.budget:
		p.limit = min(2*limit, p.chunk) // room for more
	}
	if n := len(c.Rows); n > 0 {
		last := c.Rows[n-1][p.keyAt:]
		c.Last = make([]string, len(last))
		for i, v := range last {
			c.Last[i] = string(v)
		}
	}
	c.Final = !cut && len(c.Rows) < limit
	return c, nil
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
	err := setRole(ctx, conn, p.role)
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

// setRole makes the transaction on conn run as role (SET LOCAL ROLE),
// when one is set: backfill.reader_role.
func setRole(ctx context.Context, conn *pgx.Conn, role string) error {
	if role == "" {
		return nil
	}
	if _, err := conn.Exec(ctx, "SET LOCAL ROLE "+pgident.Ident(role)); err != nil {
		return &Error{Msg: fmt.Sprintf("backfill.reader_role %s: %s; create it, grant it SELECT on the outbox tables, and make the connector's role a member: GRANT %s TO <the connector's role>", pgident.Quote(role), pgMessage(err), pgident.Quote(role))}
	}
	return nil
}

// condition is the WHERE clause's condition: the operator's, on lines of
// its own inside parentheses (sqlwhere.Check made sure it cannot close
// them, end the statement or comment out the rest), or true.
func (p *Plan) condition() string {
	if p.Where == "" {
		return "true"
	}
	return "(\n" + p.Where + "\n)"
}

// from is the table, as a statement names it: always quoted.
func (p *Plan) from() string { return pgident.QualifiedIdent(p.Table.Name.Schema, p.Table.Name.Name) }

// holdFiles, in a repeatable-read transaction whose snapshot is taken,
// locks the table and its leaves with a read of no row, so that no rewrite
// or partition change commits until the transaction ends, and then fails
// when what the snapshot shows of the table is not what a read of it
// scans now. Neither a rewrite (ALTER TABLE ... TYPE, a volatile default,
// VACUUM FULL, CLUSTER) nor a DETACH or ATTACH is MVCC-safe: a snapshot
// from before one reads a rewritten table as empty, and a read plans its
// leaves from the catalog as it is now, so a leaf detached since (its
// rows in the snapshot's outbox) is not read, and one attached since is
// read in a snapshot that does not hold its rows. The backfill would send
// none of those rows without a word. The snapshot's pg_class and
// pg_inherits show the table, its leaves and their files as they were;
// the name, pg_partition_tree and pg_relation_filenode, as they are now
// (pg_partition_tree lists no row for a table that is not partitioned).
// It runs before the plan reads the table's key and columns, which the
// snapshot would read from a table created again as none. The error is
// not an Error: the next try takes a snapshot anew.
func holdFiles(ctx context.Context, conn *pgx.Conn, t *outbox.Source) error {
	from := pgident.QualifiedIdent(t.Name.Schema, t.Name.Name)
	if _, err := conn.Exec(ctx, "SELECT FROM "+from+" LIMIT 0"); err != nil {
		return fmt.Errorf("backfill: lock %s: %w", t, err)
	}
	var moved, changed []string
	err := conn.QueryRow(ctx, `WITH RECURSIVE was(relid) AS (
			SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $2 AND c.relname = $3
			UNION ALL
			SELECT i.inhrelid FROM was JOIN pg_inherits i ON i.inhparent = was.relid JOIN pg_class c ON c.oid = i.inhrelid AND c.relispartition),
		now(relid) AS (SELECT $1::regclass::oid UNION SELECT relid FROM pg_partition_tree($1::regclass)),
		diff(relid) AS ((SELECT relid FROM was EXCEPT SELECT relid FROM now) UNION (SELECT relid FROM now EXCEPT SELECT relid FROM was)),
		named AS (SELECT CASE WHEN c.oid IS NULL THEN d.relid::regclass::text ELSE format('%I.%I', n.nspname, c.relname) END AS name
			FROM diff d LEFT JOIN pg_class c ON c.oid = d.relid LEFT JOIN pg_namespace n ON n.oid = c.relnamespace)
		SELECT
			(SELECT coalesce(array_agg(format('%I.%I', n.nspname, c.relname) ORDER BY n.nspname, c.relname), '{}')
				FROM now t JOIN pg_class c ON c.oid = t.relid JOIN pg_namespace n ON n.oid = c.relnamespace
				WHERE c.relkind = 'r' AND c.relfilenode IS DISTINCT FROM pg_relation_filenode(c.oid)),
			(SELECT coalesce(array_agg(name ORDER BY name), '{}') FROM named)`,
		from, t.Name.Schema, t.Name.Name).Scan(&moved, &changed)
	if err != nil {
		return fmt.Errorf("backfill: check the files of %s: %w", t, err)
	}
	if len(changed) > 0 {
		return fmt.Errorf("backfill of %s: %s was created again, attached or detached after the snapshot the backfill reads was taken, and a read in such a snapshot would miss rows; nothing of it was sent, and the next try reads it in a snapshot of its own", t, strings.Join(changed, ", "))
	}
	if len(moved) > 0 {
		return fmt.Errorf("backfill of %s: %s was rewritten (ALTER TABLE ... TYPE, a volatile default, VACUUM FULL or CLUSTER) after the snapshot the backfill reads was taken, and Postgres shows such a snapshot a rewritten table as empty; nothing of it was sent, and the next try reads it in a snapshot of its own", t, strings.Join(moved, ", "))
	}
	return nil
}

// ChunkSize is how many rows a full chunk holds at most.
func (p *Plan) ChunkSize() int { return p.chunk }

func quoteAll(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = pgident.Quote(n)
	}
	return strings.Join(q, ", ")
}

// statementError is a failed statement: what was done, and the server's
// message on one line. The server's error stays reachable (errors.As), for
// the SQLSTATE: a job ends on one that a retry would meet again
// (pipeline.jobEnding).
func statementError(what string, err error) error {
	return &stmtError{msg: what + ": " + pgMessage(err), err: err}
}

type stmtError struct {
	msg string
	err error
}

func (e *stmtError) Error() string { return e.msg }
func (e *stmtError) Unwrap() error { return e.err }

// pgMessage is a server error's message (with its position's hint), or
// err's text, on one line.
func pgMessage(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		msg := pe.Message
		if pe.Hint != "" {
			msg += " (" + pe.Hint + ")"
		}
		return msg
	}
	return errtext.OneLine(err)
}
