package retention

import (
	"context"
	"errors"
	"fmt"
	"strings"

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
//     a partition, after the ATTACH that made it a partition of the
//     table (pg_inherits' row, its own and its ancestors', by xid and
//     command id), or after its rewrite since then, unless it was created
//     as a partition (coveredCTE): a partition attached with rows in it
//     never had them streamed;
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

// linkCTE are x, the next xid, and link: each leaf partition of the
// relation ($1) with the pg_inherits row that made it (or an ancestor) a
// partition of the table last, by xid and then command id: its 64-bit xid
// (joined), its command id (jcid, NULL where the row's xmax is set: a
// deleter, or an aborted one, may have replaced it with a combo id),
// and whether it is the leaf's own row (own). A table that is not
// partitioned has no leaf.
var linkCTE = `x AS (SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS next),
	link AS (SELECT l.relid AS leaf, j.joined, j.jcid, coalesce(j.own, false) AS own
		FROM pg_partition_tree($1::oid::regclass) l CROSS JOIN x
		LEFT JOIN LATERAL (SELECT ` + xid64("i.xmin") + ` AS joined, CASE WHEN i.xmax::text = '0' THEN i.cmin::text::bigint END AS jcid,
				i.inhrelid = l.relid AS own
			FROM pg_inherits i WHERE i.inhrelid IN (SELECT relid FROM pg_partition_ancestors(l.relid))
			ORDER BY 1 DESC, i.cmin::text::bigint DESC LIMIT 1) j ON true
		WHERE l.isleaf)`

// coveredCTE are the common table expressions the deletes and the checks
// of a table's rows use: linkCTE's, and lf, each leaf with what tells its
// streamed rows from those that may never have been (covered):
//
//   - born: the leaf was created as a partition of the table (CREATE
//     TABLE ... PARTITION OF, of the table or of a partition already in
//     it): the link is its own row, and a column's pg_attribute row is
//     still the one its creation wrote, with the creation's xid and
//     command id (an ATTACH rewrites every column's row). Every row of
//     it was written while it was in the table, streamed, those of its
//     creating transaction too; a rewrite changes nothing.
//   - joined and jcid, for the others: a table attached with rows never
//     had them streamed; the rows its attaching transaction wrote after
//     the ATTACH (a later command id) were. But a rewrite of the leaf
//     since (ALTER TABLE ... TYPE on the table, a volatile default) gave
//     the rows it had its own xid, above the attach's, and they would
//     pass for streamed ones: for a leaf no longer in the file it was
//     created with (relfilenode is not its oid) whose catalog rows
//     changed since it joined, joined is the newest xid among them
//     instead, and no command id of it tells anything. Among them, not
//     pg_class's alone: a rewrite in a subtransaction, or by a
//     transaction younger than one that touches the table's pg_class row
//     after it, leaves pg_class with an xid below the rows' own, but the
//     column it changed or added (pg_attribute, pg_attrdef) keeps the
//     rewrite's. Every row the rewrite carried is kept, streamed or not;
//     VACUUM FULL and CLUSTER, which keep xids, are not told apart and
//     keep them too (docs/design.md, "Retention").
//   - below: the attaching transaction may have written rows into the
//     table before the ATTACH in a savepoint, whose xid is above its own;
//     rows above joined and below below, an xid every subtransaction of
//     it is under (Cleaner.attachBounds), are kept unless they were
//     written after the ATTACH by command id, unless the ATTACH was its
//     transaction's first command.
//
// bounds is a VALUES list of (leaf, below) from attachBounds; a leaf it
// does not list keeps every row of that window.
func coveredCTE(bounds string) string {
	if bounds == "" {
		bounds = "VALUES (0::oid, 0::bigint)"
	}
	return linkCTE + `,
	changed AS (SELECT link.*, c.relfilenode <> c.oid AS moved,
			link.own AND a.xmax::text = '0' AND ` + xid64("a.xmin") + ` = link.joined AND EXISTS (SELECT 1 FROM pg_attribute u
				WHERE u.attrelid = link.leaf AND u.attnum > 0 AND NOT u.attisdropped AND u.xmin = a.xmin AND u.cmin = a.cmin AND u.xmax::text = '0') AS born,
			greatest(` + xid64("c.xmin") + `, (SELECT max(` + xid64("ca.xmin") + `) FROM pg_attribute ca WHERE ca.attrelid = link.leaf),
				(SELECT max(` + xid64("d.xmin") + `) FROM pg_attrdef d WHERE d.adrelid = link.leaf)) AS at
		FROM x CROSS JOIN link JOIN pg_class c ON c.oid = link.leaf LEFT JOIN pg_attribute a ON a.attrelid = link.leaf AND a.attnum = -1),
	bounds(leaf, below) AS (` + bounds + `),
	lf AS (SELECT changed.leaf, coalesce(born, false) AS born,
			CASE WHEN NOT coalesce(born, false) AND moved AND at > joined THEN at ELSE joined END AS joined,
			CASE WHEN NOT coalesce(born, false) AND moved AND at > joined THEN NULL ELSE jcid END AS jcid,
			coalesce(b.below, 9223372036854775807) AS below
		FROM changed LEFT JOIN bounds b ON b.leaf = changed.leaf)`
}

// rewrittenLeaves names the leaves of the relation st covers whose rows
// retention keeps up to a change of their catalog rows rather than up to
// their attach (coveredCTE): "" when none.
func rewrittenLeaves(ctx context.Context, conn *pgx.Conn, st checkpoint.Table) (string, error) {
	var names string
	err := conn.QueryRow(ctx, `WITH `+coveredCTE("")+` SELECT coalesce(string_agg(leaf::regclass::text, ', ' ORDER BY leaf), '')
		FROM changed WHERE NOT coalesce(born, false) AND moved AND at > joined`, st.Rel).Scan(&names)
	return names, err
}

// covered is the condition on row t (left-joined to lf on its tableoid,
// with x) that the stream carried it, as far as its partition tells
// (coveredCTE): a row of a leaf lf does not hold (attached since it was
// read) is not.
var covered = `((t.tableoid = $1::oid AND lf.leaf IS NULL) OR lf.born OR coalesce(
	(` + written + ` > lf.joined AND (` + written + ` >= lf.below OR lf.jcid = 0 OR ` + afterAttach + `)) OR (` + written + ` = lf.joined AND ` + afterAttach + `), false))`

// afterAttach: row t was written after the ATTACH, in its transaction, by
// command id; never when the row's xmax is set (its command id may then
// be a combo id) or the ATTACH's is not known.
const afterAttach = `coalesce(t.xmax::text = '0' AND t.cmin::text::bigint > lf.jcid, false)`

// deletable is the condition on row t that a mark with xmin $2 and the
// table's floor $3 allow deleting.
var deletable = written + ` < $2 AND ` + written + ` >= $3 AND ` + covered

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

// attachLink is a leaf's link (linkCTE) in the relation rel.
type attachLink struct {
	rel, leaf    uint32
	joined, jcid int64
}

// attachBounds is coveredCTE's bounds for the leaves of the relation st
// covers: for each leaf's link, the next xid of the first sweep of this
// process that saw it. That sweep's snapshot saw the ATTACH committed, so
// every xid its transaction, savepoints included, wrote rows with is
// below. Kept in memory only: after a restart the bound is later, and the
// rows between the two, when written by a command id at or below the
// ATTACH's, are kept (the log names the partition in drop_partitions
// mode); a bound later than needed only keeps more.
func (c *Cleaner) attachBounds(ctx context.Context, conn *pgx.Conn, st checkpoint.Table) (string, error) {
	rows, err := conn.Query(ctx, `WITH `+linkCTE+` SELECT leaf::bigint, coalesce(joined, -1), coalesce(jcid, -1), x.next FROM link CROSS JOIN x`, st.Rel)
	if err != nil {
		return "", err
	}
	type row struct {
		leaf, joined, jcid, next int64
	}
	leaves, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
		var l row
		return l, r.Scan(&l.leaf, &l.joined, &l.jcid, &l.next)
	})
	if err != nil {
		return "", err
	}
	if c.bounds == nil {
		c.bounds = map[attachLink]int64{}
	}
	seen := map[attachLink]bool{}
	var values []string
	for _, l := range leaves {
		k := attachLink{rel: st.Rel, leaf: uint32(l.leaf), joined: l.joined, jcid: l.jcid}
		if _, ok := c.bounds[k]; !ok {
			c.bounds[k] = l.next
		}
		seen[k] = true
		values = append(values, fmt.Sprintf("(%d::oid, %d::bigint)", k.leaf, c.bounds[k]))
	}
	for k := range c.bounds {
		if k.rel == st.Rel && !seen[k] {
			delete(c.bounds, k)
		}
	}
	if len(values) == 0 {
		return "", nil
	}
	return "VALUES " + strings.Join(values, ", "), nil
}
