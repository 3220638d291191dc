package retention

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/outbox"
)

// rangeUpper reads a range partition's upper bound, as pg_get_expr
// writes it: FOR VALUES FROM (...) TO ('2026-02-01 00:00:00+00').
var rangeUpper = regexp.MustCompile(`^FOR VALUES FROM \(.*\) TO \('((?:[^']|'')*)'\)$`)

// partition is one partition of a table, as the catalog has it.
type partition struct{ name, bound string }

// dropPartitions detaches and drops t's range partitions whose upper
// bound is at or before horizon (a partition's age is its range's, not a
// mark's) and whose every row mark and the facts allow deleting.
//
// Each is first read without a lock: most sweeps drop nothing, and the
// lock below holds the application's inserts. Then, in one transaction,
// the table and the partition are locked (ACCESS EXCLUSIVE, as DETACH
// takes it anyway), the facts and the partition's rows checked again
// under that lock, and only then is it detached and dropped; anything
// that no longer allows it rolls the transaction back. The application's
// inserts into the outbox wait meanwhile: for the lock (lock_timeout at
// most) and for one read of the partition (docs/operations.md,
// "Retention").
func (c *Cleaner) dropPartitions(ctx context.Context, conn *pgx.Conn, t *outbox.Source, st checkpoint.Table, mark checkpoint.RetentionMark, bounds string, horizon time.Time) error {
	rows, err := conn.Query(ctx, `SELECT format('%I.%I', n.nspname, c.relname), coalesce(pg_get_expr(c.relpartbound, c.oid), '')
		FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE i.inhparent = $1::oid ORDER BY c.relname`, st.Rel)
	if err != nil {
		return c.failed(t, "list partitions", err)
	}
	parts, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (partition, error) {
		var p partition
		return p, r.Scan(&p.name, &p.bound)
	})
	if err != nil {
		return c.failed(t, "list partitions", err)
	}
	if len(parts) == 0 {
		c.once("nopart "+t.String(), "retention.mode drop_partitions: "+t.String()+" has no partitions; use mode delete")
		return nil
	}
	for _, p := range parts {
		m := rangeUpper.FindStringSubmatch(p.bound)
		if m == nil {
			continue // the default partition, or not a range: never dropped
		}
		upper := strings.ReplaceAll(m[1], "''", "'")
		old, keep, err := c.partitionKept(ctx, conn, t, st, mark, bounds, p, upper, horizon)
		if err != nil || !old || keep {
			if errors.Is(err, errNotTime) {
				return nil
			}
			if err != nil {
				return c.failed(t, "read partition "+p.name, err)
			}
			continue
		}
		if c.afterLook != nil {
			c.afterLook(p.name)
		}
		dropped, err := c.dropPartition(ctx, conn, st, mark, bounds, p)
		if err != nil {
			return c.failed(t, "drop partition "+p.name, err)
		}
		if dropped {
			c.Metrics.RetentionDropped(t.String())
			c.Log.Info("retention: dropped a partition whose rows are all delivered and older than retention.after", "table", t.String(), "partition", p.name, "upper_bound", upper)
		}
	}
	return nil
}

// errNotTime is a table whose partitions are not ranges of time.
var errNotTime = errors.New("partitions are not ranges of time")

// undeletable counts, in partition p (a relation of the table st covers,
// $1), the rows mark ($2) does not allow deleting yet (young) and those
// the stream never carried (uncovered: below the table's floor $3, or
// not covered by their partition's history: coveredCTE with bounds).
func undeletable(p, bounds string) string {
	return fmt.Sprintf(`WITH %s SELECT
		count(*) FILTER (WHERE %s >= $2),
		count(*) FILTER (WHERE NOT (%s >= $3 AND %s))
		FROM %s t CROSS JOIN x LEFT JOIN lf ON lf.leaf = t.tableoid`, coveredCTE(bounds), written, written, covered, p)
}

// partitionKept reads partition p without a lock: whether its range ends
// at or before horizon (old), and whether a row in it must stay (keep).
func (c *Cleaner) partitionKept(ctx context.Context, conn *pgx.Conn, t *outbox.Source, st checkpoint.Table, mark checkpoint.RetentionMark, bounds string, p partition, upper string, horizon time.Time) (old, keep bool, err error) {
	err = conn.QueryRow(ctx, `SELECT $1::timestamptz <= $2`, upper, horizon).Scan(&old)
	var pe *pgconn.PgError
	if errors.As(err, &pe) && strings.HasPrefix(pe.Code, "22") {
		c.once("bound "+t.String(), fmt.Sprintf("retention.mode drop_partitions: the partitions of %s are not ranges of time (%s); use mode delete", t, p.bound))
		return false, false, errNotTime
	}
	if err != nil || !old {
		return old, false, err
	}
	var young, uncovered int64
	if err := conn.QueryRow(ctx, undeletable(p.name, bounds), st.Rel, int64(mark.XMin), int64(st.Floor)).Scan(&young, &uncovered); err != nil {
		return true, false, err
	}
	if uncovered > 0 {
		c.once("uncovered "+p.name, fmt.Sprintf("retention keeps partition %s of %s: %d of its rows were written before the stream covered them (before the connector's first start, or before the partition was attached to the table, or rewritten after it was attached with rows), so Kafka may not hold their events; send them with cdc backfill if they are events, then drop the partition yourself", p.name, t, uncovered))
	}
	return true, young > 0 || uncovered > 0, nil
}

// dropPartition detaches and drops partition p in one transaction, after
// checking, under the locks, the facts and that every row of it may go.
// dropped is false when something changed since the look without a lock.
func (c *Cleaner) dropPartition(ctx context.Context, conn *pgx.Conn, st checkpoint.Table, mark checkpoint.RetentionMark, bounds string, p partition) (dropped bool, err error) {
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '"+lockTimeout+"'"); err != nil {
			return err
		}
		// The table first, as DETACH does, then the partition and its own
		// partitions: an insert straight into the partition locks only it.
		parent, err := lockCovered(ctx, tx, c.Postgres.Publication, st, "ACCESS EXCLUSIVE")
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "LOCK TABLE "+p.name+" IN ACCESS EXCLUSIVE MODE"); err != nil {
			return err
		}
		// A partition at or below p whose DETACH ... CONCURRENTLY did not
		// finish is out of the table's scans and of the stream (its rows
		// written since were never events), but DROP TABLE takes it along.
		var pending string
		if err := tx.QueryRow(ctx, `WITH RECURSIVE sub(rel) AS (SELECT $1::regclass::oid UNION SELECT i.inhrelid FROM pg_inherits i JOIN sub ON i.inhparent = sub.rel)
			SELECT coalesce(string_agg(i.inhrelid::regclass::text, ', '), '') FROM pg_inherits i JOIN sub ON i.inhrelid = sub.rel WHERE i.inhdetachpending`, p.name).Scan(&pending); err != nil {
			return err
		}
		if pending != "" {
			c.once("pending "+p.name, fmt.Sprintf("retention keeps partition %s: %s is pending a detach (DETACH PARTITION ... CONCURRENTLY did not finish), so its rows are not streamed and a drop would take them; finish it with ALTER TABLE ... DETACH PARTITION ... FINALIZE, and send its rows with cdc backfill if they are events", p.name, pending))
			return errKept
		}
		var young, uncovered int64
		if err := tx.QueryRow(ctx, undeletable(p.name, bounds), st.Rel, int64(mark.XMin), int64(st.Floor)).Scan(&young, &uncovered); err != nil {
			return err
		}
		if young > 0 || uncovered > 0 {
			return errKept // a row written since the look: the partition stays
		}
		if _, err := tx.Exec(ctx, fmt.Sprintf("ALTER TABLE %s DETACH PARTITION %s", parent, p.name)); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, "DROP TABLE "+p.name)
		return err
	})
	if errors.Is(err, errKept) {
		return false, nil
	}
	return err == nil, err
}

// errKept rolls back a drop whose partition holds a row that must stay.
var errKept = errors.New("the partition holds a row that must stay")
