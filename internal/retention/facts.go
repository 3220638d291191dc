package retention

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/postgres"
	"github.com/outboxcdc/cdc/internal/setup"
)

// What retention deletes on (docs/design.md, "Retention"). A row of an
// outbox table may go only when each of these is a fact, checked in the
// transaction that deletes it, after the table is locked against the DDL
// that could change them:
//
//   - the relation is the one the saved checkpoint says the stream covered
//     (checkpoint.Table.Rel, followed by its id whatever its name): a
//     table recreated, swapped or not repaired yet is another relation,
//     and keeps its rows;
//   - it is published through the same membership as when the coverage
//     began (checkpoint.Table.Member), with inserts and without a row
//     filter: a table removed from the publication and added back has
//     another, and its rows of the time between were never streamed;
//   - the row's transaction is at or above the table's Floor (its rows
//     below were never streamed: a first start without a backfill), and
//     the table was not rewritten since the Floor was set
//     (checkpoint.Table.Files: a rewrite gives its rows its xid); and, in
//     a partition, after the one that made it a partition of the table
//     (pg_inherits' row, its own and its ancestors'), or after its rewrite
//     since then when it existed before (coveredCTE): a partition attached
//     with rows in it never had them streamed;
//   - the row's transaction is below the xmin of a mark whose position the
//     saved checkpoint confirmed (marks.go): it committed before that
//     position, so Kafka acknowledged its event.

// xid64 is the 64-bit xid of a 32-bit xid column col, in the epoch of the
// server's next xid (x.next), or the one before when col is above that
// xid's low half. An xid older than 2^32 transactions may be placed an
// epoch late: it then compares newer than it is. As a floor, more rows
// are kept; as the writer of a row above its floor, the row waits. But a
// row kept for good (below its floor, or attached with its partition)
// reads as above its floor then and may go: docs/design.md, "What the
// watch cannot see".
func xid64(col string) string { return postgres.XID64(col, "x.next") }

// written is the 64-bit xid of the transaction that wrote row t. A row
// updated since its insert carries the updater's xid, which is newer: it
// waits longer for a mark; but against a Floor it is wrong, and an
// outbox's rows below it must not be updated (docs/design.md,
// "Retention"). A rewrite gives every row its xid: checkFacts sees it by
// the table's files.
var written = xid64("t.xmin")

// coveredCTE are the common table expressions the deletes and the checks
// of a table's rows use: x, the next xid, and lf, each leaf partition of
// the relation ($1) with the xid at and below which its rows may never
// have been streamed (joined). A table that is not partitioned has none.
//
// That is the xid that made the leaf (and its ancestors) a partition of
// the table: a table attached with rows in it never had them streamed.
// But a rewrite of the leaf since (ALTER TABLE ... TYPE on the table, a
// volatile default) gave those rows its own xid, above the attach's, and
// they would pass for streamed ones: for a leaf that existed before it
// joined (its creation, its system column ctid's pg_attribute row, is
// not the joining transaction) and that is not in the file it was
// created with (relfilenode is no longer its oid) while its catalog rows
// changed since it joined, joined is the newest xid among them instead.
// Among them, not pg_class's alone: a rewrite in a subtransaction, or by
// a transaction younger than one that touches the table's pg_class row
// after it, leaves pg_class with an xid below the rows' own, but the
// column it changed or added (pg_attribute, pg_attrdef) keeps the
// rewrite's. Every row the rewrite carried is kept, streamed or not;
// VACUUM FULL and CLUSTER, which keep xids, are not told apart and keep
// them too (docs/design.md, "Retention").
var coveredCTE = `x AS (SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS next),
	tree AS (SELECT l.relid AS leaf, (SELECT max(` + xid64("i.xmin") + `) FROM pg_inherits i
		WHERE i.inhrelid IN (SELECT relid FROM pg_partition_ancestors(l.relid))) AS joined
		FROM pg_partition_tree($1::oid::regclass) l, x WHERE l.isleaf),
	changed AS (SELECT tree.leaf, tree.joined, c.relfilenode <> c.oid AS moved, ` + xid64("a.xmin") + ` AS created,
			greatest(` + xid64("c.xmin") + `, (SELECT max(` + xid64("ca.xmin") + `) FROM pg_attribute ca WHERE ca.attrelid = tree.leaf),
				(SELECT max(` + xid64("d.xmin") + `) FROM pg_attrdef d WHERE d.adrelid = tree.leaf)) AS at
		FROM x CROSS JOIN tree JOIN pg_class c ON c.oid = tree.leaf LEFT JOIN pg_attribute a ON a.attrelid = tree.leaf AND a.attnum = -1),
	lf AS (SELECT leaf, CASE WHEN moved AND created IS DISTINCT FROM joined AND at > joined THEN at ELSE joined END AS joined FROM changed)`

// rewrittenLeaves names the leaves of the relation st covers whose rows
// retention keeps up to a change of their catalog rows rather than up to
// their attach (coveredCTE): "" when none.
func rewrittenLeaves(ctx context.Context, conn *pgx.Conn, st checkpoint.Table) (string, error) {
	var names string
	err := conn.QueryRow(ctx, `WITH `+coveredCTE+` SELECT coalesce(string_agg(leaf::regclass::text, ', ' ORDER BY leaf), '')
		FROM changed WHERE moved AND created IS DISTINCT FROM joined AND at > joined`, st.Rel).Scan(&names)
	return names, err
}

// deletable is the condition on row t (left-joined to lf on its
// tableoid, with x) that a mark with xmin $2 and the table's floor $3
// allow deleting. A row of a leaf lf does not hold (attached since it was
// read) is kept.
var deletable = written + ` < $2 AND ` + written + ` >= $3 AND ((t.tableoid = $1::oid AND lf.leaf IS NULL) OR ` + written + ` > lf.joined)`

// errChanged is a fact that no longer holds: the table is skipped until
// the checkpoint says again what the stream covered of it.
type errChanged struct{ why string }

func (e *errChanged) Error() string { return e.why }

// lockCovered resolves the relation st covers to its name now, locks it
// in mode, and checks that the facts the coverage rests on still hold,
// under that lock. It returns the relation's name, quoted; an *errChanged
// when a fact does not hold.
func lockCovered(ctx context.Context, tx pgx.Tx, publication string, st checkpoint.Table, mode string) (string, error) {
	var name string
	err := tx.QueryRow(ctx, `SELECT format('%I.%I', n.nspname, c.relname) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = $1::oid`, st.Rel).Scan(&name)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", &errChanged{"the relation the stream covered is gone (dropped or recreated)"}
	}
	if err != nil {
		return "", err
	}
	if _, err := tx.Exec(ctx, "LOCK TABLE ONLY "+name+" IN "+mode+" MODE"); err != nil {
		return "", err
	}
	return name, checkFacts(ctx, tx, publication, st, name)
}

// checkFacts checks, with the relation named name locked, that it is
// still st's relation under that name, and published as when the
// coverage began.
func checkFacts(ctx context.Context, tx pgx.Tx, publication string, st checkpoint.Table, name string) error {
	var same, inserts bool
	err := tx.QueryRow(ctx, `SELECT coalesce(to_regclass($1)::oid = $2::oid, false),
		coalesce((SELECT pubinsert FROM pg_publication WHERE pubname = $3), false)`, name, st.Rel, publication).Scan(&same, &inserts)
	if err != nil {
		return err
	}
	if !same {
		return &errChanged{"the table was renamed while retention looked at it"}
	}
	if !inserts {
		return &errChanged{"the publication does not publish inserts"}
	}
	rs, err := setup.ReadRelation(ctx, tx, publication, st.Rel)
	if err != nil {
		return err
	}
	switch {
	case rs.Unlogged:
		return &errChanged{"the table is unlogged: its inserts do not reach the WAL"}
	case !rs.Published:
		return &errChanged{"the table is not in the publication"}
	case rs.Member != st.Member:
		return &errChanged{fmt.Sprintf("the table left the publication and came back (membership %s, the stream covered %s)", rs.Member, st.Member)}
	case rs.Filtered:
		return &errChanged{"the publication has a row filter for the table"}
	}
	if st.Floor == 0 || st.Files == nil {
		return nil
	}
	files, err := setup.RelFiles(ctx, tx, st.Rel)
	if err != nil {
		return err
	}
	if setup.Rewritten(st.Files, files) {
		return &errChanged{"the table was rewritten since its floor was set: its rows' transactions no longer tell those streamed from those below the floor (a new floor is set)"}
	}
	return nil
}
