package tableread

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/outboxcdc/cdc/internal/decode"
	"github.com/outboxcdc/cdc/internal/errtext"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/pgident"
	"github.com/outboxcdc/cdc/internal/postgres"
	"github.com/outboxcdc/cdc/internal/sqlwhere"
)

// Plan is how to read one table's matching rows in chunks, in an order.
type Plan struct {
	Table *outbox.Source
	Where string
	// Order is the order the rows are read in; Key names the key's terms
	// in it, for messages: order_by's columns then the primary key's, or
	// the commit order's terms then the primary key's.
	Order Order
	Key   []string
	terms []term
	// prefix is how many of the terms are the commit order's (0 for
	// OrderColumns); group how many of those name one commit: the commit
	// timestamp (and, where a row has none, its xmin) with
	// OrderCommitTime, the xmin with OrderCommit. A Cursor orders the rows
	// of one group by where they lie in the table, and a job resumes at
	// the start of the group it stopped in.
	prefix, group int
	// queries are the chunk queries, by whether they have a key to start
	// after and a key to stop at; Columns are their result columns.
	queries [2][2]string
	last    string // the query of the last key
	// rows is the query a Cursor reads: every matching row in the key's
	// order, in two parts that resume, the condition on a resumed job's
	// rows, goes between (rowsQuery). Not a format string: the condition
	// is the operator's SQL, and a LIKE 'a%' in it is no verb.
	rows [2]string
	copy string // CopySQL's
	// resume is the condition on a resumed job's rows: from the first row
	// of the commit it stopped in, or (resume[1]) past that commit, which
	// it sent whole (Plan.Whole).
	resume  [2]string
	Columns []decode.Column
	keyAt   int // index of the first key column in a row
	chunk   int
	// Role is backfill.reader_role: what the condition runs as in a
	// read-only transaction of the plan's own ("": the connection's
	// role). A read in the caller's transaction runs as SetRole made it.
	Role string
	// budget bounds a chunk's bytes (SetBudget): rows are read until it
	// is reached, and limit, the rows the next query asks for, follows
	// the rows' size: it grows from firstLimit while chunks fit, up to
	// chunk, and shrinks to what fit when one did not.
	budget int64
	limit  int
	// most is the rows a query asks for at most: chunk, unless
	// SetReadRows raised it for a Cursor whose chunks are handed out a
	// chunk_size at a time.
	most int
	// leaves, when set (ReadLeaves), are the only partitions read.
	leaves []uint32
	// partitioned: the table is partitioned, and its rows are its leaves'
	// (from).
	partitioned bool
}

// Order is the order a plan reads a table's rows in (docs/design.md,
// "Backfill"), as a job keeps it (checkpoint.Job.Order).
type Order string

const (
	// OrderColumns is backfill.order_by's columns, then the primary
	// key's: the order the operator declared. Without order_by, it is
	// the primary key alone, the order of a job saved before the commit
	// order was the default, which such a job resumes in: a random uuid
	// is no order at all.
	OrderColumns Order = ""
	// OrderCommit is the order of the transactions' ids (xmin, 64-bit),
	// then the command within each (cmin), then the primary key: where
	// track_commit_timestamp is off, as near the commit order as the
	// table tells. Two transactions commit in the order of their ids
	// unless they overlapped: one that took its id (wrote first) before
	// another that committed earlier is read first. A row written in a
	// savepoint has the savepoint's id.
	OrderCommit Order = "commit"
	// OrderCommitTime is the order of the transactions' commit
	// timestamps (pg_xact_commit_timestamp(xmin), with
	// track_commit_timestamp on), then the command within each (the
	// savepoints of one transaction share its timestamp), then the
	// transaction id and the primary key. A row committed before the
	// setting was on has no timestamp: those come first, in OrderCommit.
	OrderCommitTime Order = "commit-time"
	// OrderAuto lets NewPlan choose: OrderColumns with order_by, else
	// OrderCommitTime where track_commit_timestamp is on, else
	// OrderCommit.
	OrderAuto Order = "auto"
)

// OrderNote says, for the log, which order the plan reads in and why,
// after the reader's name; commits is false where that order may not be
// the commits' (rule 32 of docs/design.md): a warning.
func (p *Plan) OrderNote() (note string, commits bool) {
	switch {
	case p.Order == OrderCommitTime:
		return " reads the rows in the order they were committed: their transactions' commit timestamps (track_commit_timestamp is on), then within each in the order the rows lie in the table; rows committed before the setting was on have none and come first, in the order of their transactions' ids", true
	case p.Order == OrderCommit:
		return " reads the rows in the order of their transactions' ids, then within each in the order they lie in the table, since track_commit_timestamp is off: that is the commit order only for transactions that did not overlap; " +
			"an aggregate's rows written by two transactions where the later one took its id before the earlier one committed, or inside a savepoint, may be sent out of the order they were committed in; " +
			"turn track_commit_timestamp on (a restart of PostgreSQL) for the rows committed from then on, or set backfill.order_by to a column that orders the events", false
	case p.Table.Backfill == nil || len(p.Table.Backfill.OrderBy) == 0:
		return " resumes in the order of the primary key, the one its saved position is in (saved before commit order was the default): a primary key is no order of the events, and an aggregate's rows may be sent out of the order they were committed in; start the backfill again to send them in commit order", false
	}
	return " reads the rows in backfill.order_by's order", true
}

// InCommitOrder reports whether the plan reads in an order of the
// commits (OrderCommit, OrderCommitTime): one no index serves, which a
// Cursor reads from one query.
func (p *Plan) InCommitOrder() bool { return p.Order == OrderCommit || p.Order == OrderCommitTime }

// term is one term of a plan's key: SQL for its value, and the type its
// saved text is cast back to.
type term struct{ sql, typ string }

// The commit order's terms. The row's xid is 64-bit, in the epoch of the
// statement's snapshot (postgres.XID64): a job's key must compare the
// same in every chunk and after a restart, and a 32-bit xid wraps. The
// xids below 3 (frozen before PostgreSQL 9.4 kept the raw xid, or the
// bootstrap's) are the oldest. A commit timestamp is microseconds since
// 1970, exact (extract returns numeric), -1 for none.
var (
	xminTerm = term{`(CASE WHEN xmin::text::bigint < 3 THEN 0 ELSE ` +
		postgres.XID64("xmin", "(SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint)") + ` END)`, "bigint"}
	commitTerm  = term{`coalesce((extract(epoch FROM pg_xact_commit_timestamp(xmin)) * 1000000)::bigint, -1)`, "bigint"}
	untimedTerm = term{`(CASE WHEN pg_xact_commit_timestamp(xmin) IS NULL THEN ` + xminTerm.sql + ` ELSE 0 END)`, "bigint"}
)

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
	p.limit = min(p.most, firstLimit)
	if n == 0 {
		p.limit = p.most
	}
}

// SetReadRows lets a query (a Cursor's FETCH) ask for up to n rows, and
// at least ChunkSize, within the byte budget as before: the caller hands
// the rows out a ChunkSize at a time. A FETCH is a round trip after
// which the server waits for the next: with chunks of 1,000 rows the
// first start's backfill waited for its reads for two thirds of its time
// (docs/benchmarks.md, "Larger reads").
func (p *Plan) SetReadRows(n int) {
	p.most = max(n, p.chunk)
	if p.budget == 0 {
		p.limit = p.most
	}
}

// NewPlan works out the key and the queries of a backfill of t's rows
// matching where ("" for all), in order (OrderAuto to choose): ordered by
// orderBy (catalog names) then the primary key with OrderColumns, and has
// the server check them. An order of the commits cannot take orderBy: a
// job saved in it resumes in it. conn must be a postgres.ConnectRows
// connection.
func NewPlan(ctx context.Context, conn *pgx.Conn, t *outbox.Source, where string, orderBy []string, order Order, chunk int) (*Plan, error) {
	cols, pk, err := readColumns(ctx, conn, t)
	if err != nil {
		return nil, err
	}
	if order, err = choose(ctx, conn, t, orderBy, order); err != nil {
		return nil, err
	}
	var key []string
	var terms []term
	switch order {
	case OrderCommitTime:
		key, terms = []string{"commit timestamp", "xmin where it has none", "xmin"}, []term{commitTerm, untimedTerm, xminTerm}
	case OrderCommit:
		key, terms = []string{"xmin"}, []term{xminTerm}
	}
	prefix, group := len(terms), len(terms)
	if order == OrderCommitTime {
		// Not the xmin: a savepoint's rows have the savepoint's own,
		// above the transaction's, and would go after the rows the
		// transaction wrote after the savepoint.
		group = 2
	}
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
		terms = append(terms, term{pgident.Ident(name), c.typ})
	}
	if err := sqlwhere.Check(strings.TrimSpace(where)); err != nil {
		return nil, errorf("backfill of %s: %v", t, err)
	}
	p := &Plan{Table: t, Where: strings.TrimSpace(where), Order: order, Key: key, terms: terms, prefix: prefix, group: group, chunk: chunk, limit: chunk, most: chunk}
	if err := conn.QueryRow(ctx, `SELECT relkind = 'p' FROM pg_class WHERE oid = $1::regclass`, t.Name.String()).Scan(&p.partitioned); err != nil {
		return nil, fmt.Errorf("read the kind of %s: %w", t, err)
	}
	p.build()
	if err := p.prepare(ctx, conn); err != nil {
		return nil, err
	}
	return p, nil
}

// choose works out the order of a plan of t asked for order with
// orderBy.
func choose(ctx context.Context, conn *pgx.Conn, t *outbox.Source, orderBy []string, order Order) (Order, error) {
	if len(orderBy) > 0 {
		if order != OrderAuto && order != OrderColumns {
			return "", errorf("backfill of %s: the job's saved position is in the order its rows were committed, and backfill.order_by was set since; start the backfill again", t)
		}
		return OrderColumns, nil
	}
	if order != OrderAuto && order != OrderCommitTime {
		return order, nil
	}
	// pg_xact_commit_timestamp fails where the setting is off.
	var on bool
	if err := conn.QueryRow(ctx, `SELECT current_setting('track_commit_timestamp')::bool`).Scan(&on); err != nil {
		return "", fmt.Errorf("backfill of %s: read track_commit_timestamp: %w", t, err)
	}
	switch {
	case on:
		return OrderCommitTime, nil
	case order == OrderCommitTime:
		return "", errorf("backfill of %s: the job reads in the order of its rows' commit timestamps, and track_commit_timestamp is off now; turn it on again (a restart of PostgreSQL), or start the backfill again", t)
	}
	return OrderCommit, nil
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
// the last key, and the rows a Cursor reads.
func (p *Plan) build() {
	t := p.Table
	var sel []string
	for _, c := range t.Needed() {
		sel = append(sel, pgident.Ident(c))
	}
	p.keyAt = len(sel)
	var keyList, desc []string
	// params are the parameters of the key's first n terms, from $from.
	params := func(from, n int) string {
		var ps []string
		for i, k := range p.terms[:n] {
			ps = append(ps, fmt.Sprintf("CAST($%d AS %s)", from+i, k.typ))
		}
		return strings.Join(ps, ", ")
	}
	for _, k := range p.terms {
		sel = append(sel, k.sql)
		keyList = append(keyList, k.sql)
		desc = append(desc, k.sql+" DESC")
	}
	cond, from := p.condition(), p.from()
	keys := "(" + strings.Join(keyList, ", ") + ")"
	for after := 0; after < 2; after++ {
		for until := 0; until < 2; until++ {
			q := fmt.Sprintf("SELECT %s FROM %s WHERE %s", strings.Join(sel, ", "), from, cond)
			n := 1
			if after == 1 {
				q += fmt.Sprintf(" AND %s > (%s)", keys, params(n, len(p.terms)))
				n += len(p.terms)
			}
			if until == 1 {
				q += fmt.Sprintf(" AND %s <= (%s)", keys, params(n, len(p.terms)))
				n += len(p.terms)
			}
			// The limit is the last parameter: it follows the rows' size.
			p.queries[after][until] = q + fmt.Sprintf(" ORDER BY %s LIMIT $%d", strings.Join(keyList, ", "), n)
		}
	}
	p.last = fmt.Sprintf("SELECT %s FROM %s WHERE %s ORDER BY %s LIMIT 1", strings.Join(keyList, ", "), from, cond, strings.Join(desc, ", "))
	// A Cursor's order puts the rows of one commit (p.group: with commit
	// timestamps, its savepoints' rows included) in the order of the
	// commands that inserted them (cmin: a transaction numbers its
	// commands, its savepoints' too), then in the order they lie in the
	// table, before the primary key. Where they lie alone is not the order
	// of the inserts: an insert reuses free space in earlier pages, and a
	// partitioned table's partitions number their own rows. But cmin is
	// the tuple's command field, which another transaction's UPDATE or
	// DELETE overwrites, even one rolled back, leaving its xmax set: a
	// commit with such a row is read as its rows lie, all of them, since
	// one row's place among the others is not known. A ctid is not kept
	// (a VACUUM FULL or an update moves it), nor is cmin: a job resumed
	// reads again every row of the commit it stopped in, from the first.
	// The rows are the inner query's, named by position, so that the
	// resume's condition (between p.rows' two halves) applies before the
	// window that looks at the commit's rows.
	inner, outer := make([]string, len(sel)), make([]string, len(sel))
	for i, e := range sel {
		inner[i], outer[i] = fmt.Sprintf("%s AS c%d", e, i), fmt.Sprintf("r.c%d", i)
	}
	var order []string
	for i := range keyList {
		if i == p.group {
			order = append(order, "r.cmd", "r.row_at")
		}
		order = append(order, fmt.Sprintf("r.c%d", p.keyAt+i))
	}
	cmd := "NULL::bigint"
	if p.group > 0 {
		cmd = fmt.Sprintf("CASE WHEN bool_or(xmax <> '0'::xid) OVER (PARTITION BY %s) THEN NULL ELSE cmin::text::bigint END", strings.Join(keyList[:p.group], ", "))
	}
	p.rows = [2]string{fmt.Sprintf("SELECT %s FROM (SELECT %s, %s AS cmd, ctid AS row_at FROM %s WHERE %s", strings.Join(outer, ", "), strings.Join(inner, ", "), cmd, from, cond),
		") r ORDER BY " + strings.Join(order, ", ")}
	if p.group > 0 {
		p.buildCopy(sel, keyList, from, cond)
		for i, op := range []string{">=", ">"} {
			p.resume[i] = fmt.Sprintf(" AND ((%s) %s (%s) OR %s >= $%d)", strings.Join(keyList[:p.group], ", "), op, params(1, p.group), xminTerm.sql, p.group+1)
		}
	}
}

// buildCopy writes CopySQL's query, of the columns sel, keyed by keyList,
// in from where cond. The copy's order is the cursor's where a commit's
// cmin are kept, by one sort, which the window that flags the other
// commits reads in: the cursor's sorts by the commit, looks at its rows,
// then sorts them again, which for a commit of a million rows took longer
// than the rows took to send (docs/benchmarks.md, "One sort for the
// copy").
func (p *Plan) buildCopy(sel, keyList []string, from, cond string) {
	by := append(append(append([]string(nil), keyList[:p.group]...), "cmin::text::bigint", "ctid"), keyList[p.group:]...)
	p.copy = fmt.Sprintf("COPY (SELECT %s, bool_or(xmax <> '0'::xid) OVER (PARTITION BY %s ORDER BY %s ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING) FROM %s WHERE %s ORDER BY %s) TO STDOUT",
		strings.Join(sel, ", "), strings.Join(keyList[:p.group], ", "), strings.Join(by[p.group:], ", "), from, cond, strings.Join(by, ", "))
}

// rowsQuery is the Cursor's query with resume ("" for none).
func (p *Plan) rowsQuery(resume string) string { return p.rows[0] + resume + p.rows[1] }

// CopySQL is a Cursor's read of every matching row, in an order of the
// commits (InCommitOrder), as a COPY to the client in text format
// (package copyread): Columns' values and, last, a flag, true on each row
// of a commit the Cursor orders by where its rows lie (one with a row
// whose xmax another transaction's UPDATE, DELETE or lock set). Up to the
// first flagged row, the rows and
// their order are the Cursor's; from there, they are not, and a Cursor
// of the same snapshot, moved past the rows before it (Cursor.Skip),
// reads on.
func (p *Plan) CopySQL() string { return p.copy }

// Budget is a chunk's bound in bytes of values (SetBudget; 0: none).
func (p *Plan) Budget() int64 { return p.budget }

// prepare has the server parse the queries: a bad condition fails here,
// before anything is sent. It reads the columns a chunk returns.
func (p *Plan) prepare(ctx context.Context, conn *pgx.Conn) error {
	t := p.Table
	for i, q := range []string{p.queries[0][0], p.queries[1][1], p.last, p.rowsQuery(p.resume[0])} {
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

// checkKey checks that key, a saved position, has a value for each term
// of the plan's key.
func (p *Plan) checkKey(key []string) error {
	if len(key) != len(p.terms) {
		return fmt.Errorf("backfill of %s: the saved position has %d key values, the key has %d columns (%s); was order_by changed? start the backfill again", p.Table, len(key), len(p.terms), strings.Join(p.Key, ", "))
	}
	return nil
}

// condition is the WHERE clause's condition: the operator's, on lines of
// its own inside parentheses (sqlwhere.Check made sure it cannot close
// them, end the statement or comment out the rest), or true.
func (p *Plan) condition() string {
	cond := "true"
	if p.Where != "" {
		cond = "(\n" + p.Where + "\n)"
	}
	if p.leaves != nil {
		ids := make([]string, len(p.leaves))
		for i, l := range p.leaves {
			ids[i] = strconv.FormatUint(uint64(l), 10)
		}
		cond += " AND tableoid = ANY('{" + strings.Join(ids, ",") + "}'::oid[])"
	}
	return cond
}

// ReadLeaves restricts the plan to the leaf partitions leaves
// (SnapshotLeaves, checkpoint.Job.Leaves), and has the server check its
// queries again; nil reads every leaf the table has when a query runs.
func (p *Plan) ReadLeaves(ctx context.Context, conn *pgx.Conn, leaves []uint32) error {
	p.leaves, p.Columns = leaves, nil
	p.build()
	return p.prepare(ctx, conn)
}

// from is the table, as a statement names it: always quoted, and ONLY
// the table unless it is partitioned. The stream takes a partition's
// insert for its table's (package leaf) and an inheritance child's for
// none: a table that inherits from the outbox is a table of its own, and
// its rows are no events of the outbox. Read along with the table's, a
// backfill would send them, and those of a table that joined by ALTER
// TABLE ... INHERIT after the snapshot was taken (which HoldFiles' lock
// does not hold off): rows never written to the outbox. A partitioned
// table holds no row of its own, and may have no child but a partition.
func (p *Plan) from() string {
	name := pgident.QualifiedIdent(p.Table.Name.Schema, p.Table.Name.Name)
	if p.partitioned {
		return name
	}
	return "ONLY " + name
}

// ChunkSize is how many rows a full chunk holds at most.
func (p *Plan) ChunkSize() int { return p.chunk }

// quoteAll is names quoted as SQL does, for a message.
func quoteAll(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = pgident.Quote(n)
	}
	return strings.Join(q, ", ")
}
