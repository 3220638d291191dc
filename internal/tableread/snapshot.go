package tableread

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/pgident"
)

// HoldFiles, in a repeatable-read transaction whose snapshot is taken,
// locks the table and its leaves with reads of no row, so that no rewrite
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
func HoldFiles(ctx context.Context, conn *pgx.Conn, t *outbox.Source) error {
	from := pgident.QualifiedIdent(t.Name.Schema, t.Name.Name)
	// The table ONLY, as a read names it (Plan.from): a table that
	// inherits from it is no outbox, and a lock on one, or a foreign one
	// that cannot be scanned, must not hold its backfill. Then a
	// partitioned table's leaves, whose rows are the table's: locked after
	// the snapshot, a leaf rewritten in between is what the check below
	// finds.
	if _, err := conn.Exec(ctx, "SELECT FROM ONLY "+from+" LIMIT 0"); err != nil {
		return fmt.Errorf("backfill: lock %s: %w", t, err)
	}
	// As the snapshot shows the name: one created again since is none,
	// which the check below reports.
	var partitioned bool
	err := conn.QueryRow(ctx, `SELECT coalesce(bool_or(c.relkind = 'p'), false) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relname = $2`, t.Name.Schema, t.Name.Name).Scan(&partitioned)
	if err != nil {
		return fmt.Errorf("backfill: read the kind of %s: %w", t, err)
	}
	if partitioned {
		if _, err := conn.Exec(ctx, "SELECT FROM "+from+" LIMIT 0"); err != nil {
			return fmt.Errorf("backfill: lock the partitions of %s: %w", t, err)
		}
	}
	var moved, changed []string
	err = conn.QueryRow(ctx, `WITH RECURSIVE was(relid) AS (
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

// SnapshotLeaves returns the leaf partitions of table t that the snapshot
// of conn's transaction shows (pg_inherits read in it), or nil when t is
// not partitioned. A read restricted to them (Plan.ReadLeaves) reads no
// partition attached after the snapshot, even one whose rows the
// snapshot shows: ATTACH takes no lock a read holds, and a partition's
// rows from before its attach were written outside the outbox. A
// partitioned table without a leaf yields {0}, a relation id no table
// has.
func SnapshotLeaves(ctx context.Context, conn *pgx.Conn, t *outbox.Source) ([]uint32, error) {
	var kind string
	var leaves []uint32
	err := conn.QueryRow(ctx, `WITH RECURSIVE root AS (
			SELECT c.oid, c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = $2),
		tree(relid) AS (SELECT oid FROM root UNION ALL
			SELECT i.inhrelid FROM tree JOIN pg_inherits i ON i.inhparent = tree.relid JOIN pg_class c ON c.oid = i.inhrelid AND c.relispartition)
		SELECT (SELECT relkind::text FROM root),
			(SELECT coalesce(array_agg(c.oid::bigint ORDER BY c.oid), '{}') FROM tree JOIN pg_class c ON c.oid = tree.relid
				WHERE c.relispartition AND c.relkind NOT IN ('p', 'I'))`,
		t.Name.Schema, t.Name.Name).Scan(&kind, &leaves)
	if err != nil {
		return nil, fmt.Errorf("backfill: read the partitions of %s: %w", t, err)
	}
	if kind != "p" {
		return nil, nil
	}
	if len(leaves) == 0 {
		leaves = []uint32{0}
	}
	return leaves, nil
}

// MissingLeaves returns those of leaves (SnapshotLeaves') that are not
// in table t's tree now: detached, or dropped.
func MissingLeaves(ctx context.Context, conn *pgx.Conn, t *outbox.Source, leaves []uint32) ([]uint32, error) {
	var gone []uint32
	err := conn.QueryRow(ctx, `SELECT coalesce(array_agg(l::bigint ORDER BY l), '{}') FROM unnest($2::oid[]) l
		WHERE l <> 0 AND l NOT IN (SELECT relid FROM pg_partition_tree($1::regclass))`,
		pgident.QualifiedIdent(t.Name.Schema, t.Name.Name), leaves).Scan(&gone)
	if err != nil {
		return nil, fmt.Errorf("backfill: read the partitions of %s: %w", t, err)
	}
	return gone, nil
}
