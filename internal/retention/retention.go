package retention

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/errtext"
	"github.com/outboxcdc/cdc/internal/metrics"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/pgident"
	"github.com/outboxcdc/cdc/internal/postgres"
)

// Cleaner deletes what the tables' retention allows, beside the stream.
// Its fields are the pipeline's; Marks and SetMarks keep its marks in the
// checkpoint, so that a restart does not start counting ages afresh.
type Cleaner struct {
	Postgres postgres.Config
	Tables   []*outbox.Source // the tables with Retention
	// Confirmed is the saved checkpoint's confirmed position: every
	// transaction that ended at or before it is delivered.
	Confirmed func() pglogrepl.LSN
	// Pending reports whether an unfinished backfill job reads the table
	// (as SQL names it).
	Pending func(table string) bool
	// Marks are the marks the saved checkpoint holds; SetMarks hands the
	// new list to the next checkpoints.
	Marks    []checkpoint.RetentionMark
	SetMarks func([]checkpoint.RetentionMark)
	// Pause is the wait between two batches of one table: the deletes'
	// WAL goes through the walsender the stream reads. Default 200ms.
	Pause   time.Duration
	Log     hclog.Logger
	Metrics *metrics.Metrics

	warned map[string]bool
}

// maxMarks bounds the marks kept: one an interval, over the longest
// retention.after.
const maxMarks = 256

// lockTimeout bounds how long a batch waits for a lock an application
// holds on a row or the table: the batch gives way, and runs again later.
const lockTimeout = "1s"

// interval is how often marks are taken and tables swept: a fraction of
// the shortest retention.after, at least a second and at most a minute.
func (c *Cleaner) interval() time.Duration {
	short, long := time.Duration(0), time.Duration(0)
	for _, t := range c.Tables {
		if a := t.Retention.After; short == 0 || a < short {
			short = a
		}
		long = max(long, t.Retention.After)
	}
	return min(max(short/4, long/maxMarks, time.Second/2), time.Minute)
}

// Run takes a mark and sweeps every interval until ctx ends.
func (c *Cleaner) Run(ctx context.Context) {
	if len(c.Tables) == 0 {
		return
	}
	if c.Pause == 0 {
		c.Pause = 200 * time.Millisecond
	}
	c.warned = map[string]bool{}
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(context.WithoutCancel(ctx))
		}
	}()
	t := time.NewTicker(c.interval())
	defer t.Stop()
	for {
		var err error
		if conn == nil {
			// On a hot standby's connector, the primary (primary_url).
			conn, _, err = postgres.ConnectWritable(ctx, c.Postgres)
		}
		if err == nil {
			err = c.sweep(ctx, conn)
		}
		if err != nil && ctx.Err() == nil {
			c.Log.Warn("retention: trying again later", "error", errtext.OneLine(err))
			if conn != nil && conn.IsClosed() {
				conn = nil
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// sweep takes a mark, then deletes, table by table, what the newest mark
// old enough and confirmed allows.
func (c *Cleaner) sweep(ctx context.Context, conn *pgx.Conn) error {
	var m checkpoint.RetentionMark
	var standby bool
	err := conn.QueryRow(ctx, `SELECT pg_is_in_recovery()`).Scan(&standby)
	if err != nil {
		return fmt.Errorf("read pg_is_in_recovery: %w", err)
	}
	if standby {
		c.once("standby", "retention deletes on the primary: postgres.url is a hot standby, where nothing can be deleted; set postgres.primary_url")
		return nil
	}
	// The snapshot is the statement's, taken before the WAL position is
	// read: every transaction below its xmin ended before that position.
	err = conn.QueryRow(ctx, `SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint, pg_current_wal_insert_lsn(), clock_timestamp()`).Scan(&m.XMin, &m.LSN, &m.Time)
	if err != nil {
		return fmt.Errorf("take a retention mark: %w", err)
	}
	c.Marks = append(c.Marks, m)
	confirmed := c.Confirmed()
	now := m.Time
	var errs []error
	for _, t := range c.Tables {
		mark, ok := c.eligible(t.Retention.After, now, confirmed)
		if !ok {
			continue
		}
		if c.Pending != nil && c.Pending(t.String()) {
			c.once("backfill "+t.String(), "retention of "+t.String()+" waits while a backfill of it runs: the job may still have to read its rows")
			continue
		}
		var err error
		if t.Retention.Mode == outbox.RetentionDropPartitions {
			err = c.dropPartitions(ctx, conn, t, mark, now.Add(-t.Retention.After))
		} else {
			err = c.delete(ctx, conn, t, mark)
		}
		if err != nil {
			c.Metrics.RetentionError(t.String())
			errs = append(errs, err)
			continue
		}
		c.Metrics.RetentionRan(t.String(), now)
	}
	c.prune(now, confirmed)
	if c.SetMarks != nil {
		c.SetMarks(append([]checkpoint.RetentionMark(nil), c.Marks...))
	}
	return errors.Join(errs...)
}

// eligible returns the newest mark taken at least after before now whose
// position the checkpoint has confirmed.
func (c *Cleaner) eligible(after time.Duration, now time.Time, confirmed pglogrepl.LSN) (checkpoint.RetentionMark, bool) {
	for i := len(c.Marks) - 1; i >= 0; i-- {
		m := c.Marks[i]
		if !m.Time.After(now.Add(-after)) && m.LSN <= confirmed {
			return m, true
		}
	}
	return checkpoint.RetentionMark{}, false
}

// prune drops the marks no table needs: those older than the newest one
// each table could use now, and past maxMarks, the oldest.
func (c *Cleaner) prune(now time.Time, confirmed pglogrepl.LSN) {
	keepFrom := len(c.Marks)
	for _, t := range c.Tables {
		i := len(c.Marks) - 1
		for ; i >= 0; i-- {
			if m := c.Marks[i]; !m.Time.After(now.Add(-t.Retention.After)) && m.LSN <= confirmed {
				break
			}
		}
		keepFrom = min(keepFrom, max(i, 0))
	}
	keepFrom = max(keepFrom, len(c.Marks)-maxMarks)
	c.Marks = append([]checkpoint.RetentionMark(nil), c.Marks[keepFrom:]...)
}

// written is the 64-bit xid of the transaction that wrote a row, from its
// 32-bit xmin: in the epoch of the server's next xid, or the one before
// when the xmin is above that xid's low half. A row older than 2^32
// transactions may be placed an epoch late: its xid then compares newer
// than it is, and the row waits, never goes early.
const written = `((CASE WHEN t.xmin::text::bigint <= (x.next & 4294967295) THEN x.next >> 32 ELSE (x.next >> 32) - 1 END) << 32 | t.xmin::text::bigint)`

// delete deletes t's rows written below mark's xmin, in batches.
func (c *Cleaner) delete(ctx context.Context, conn *pgx.Conn, t *outbox.Source, mark checkpoint.RetentionMark) error {
	name := pgident.QualifiedIdent(t.Name.Schema, t.Name.Name)
	// tableoid with ctid: a partitioned table's partitions each number
	// their own rows.
	q := fmt.Sprintf(`WITH x AS (SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS next),
		doomed AS (SELECT t.tableoid, t.ctid FROM %s t, x WHERE %s < $1 LIMIT $2)
		DELETE FROM %s d USING doomed WHERE d.tableoid = doomed.tableoid AND d.ctid = doomed.ctid`, name, written, name)
	total := int64(0)
	for ctx.Err() == nil {
		var n int64
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '"+lockTimeout+"'"); err != nil {
				return err
			}
			tag, err := tx.Exec(ctx, q, int64(mark.XMin), t.Retention.BatchSize)
			n = tag.RowsAffected()
			return err
		})
		if err != nil {
			return c.failed(t, "delete", err)
		}
		total += n
		c.Metrics.RetentionDeleted(t.String(), n)
		if n < int64(t.Retention.BatchSize) {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(c.Pause): // pacing: the deletes' WAL goes through the walsender the stream reads
		}
	}
	if total > 0 && c.Log.IsDebug() {
		c.Log.Debug("retention: deleted rows", "table", t.String(), "rows", total)
	}
	return nil
}

// rangeUpper reads a range partition's upper bound, as pg_get_expr
// writes it: FOR VALUES FROM (...) TO ('2026-02-01 00:00:00+00').
var rangeUpper = regexp.MustCompile(`^FOR VALUES FROM \(.*\) TO \('((?:[^']|'')*)'\)$`)

// dropPartitions detaches and drops t's partitions whose range ends at
// or before horizon and which hold no row written at or above mark's xmin.
func (c *Cleaner) dropPartitions(ctx context.Context, conn *pgx.Conn, t *outbox.Source, mark checkpoint.RetentionMark, horizon time.Time) error {
	parent := pgident.QualifiedIdent(t.Name.Schema, t.Name.Name)
	rows, err := conn.Query(ctx, `SELECT n.nspname, c.relname, pg_get_expr(c.relpartbound, c.oid)
		FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE i.inhparent = $1::regclass ORDER BY c.relname`, parent)
	if err != nil {
		return c.failed(t, "list partitions", err)
	}
	type part struct{ schema, name, bound string }
	parts, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (part, error) {
		var p part
		return p, r.Scan(&p.schema, &p.name, &p.bound)
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
		child := pgident.QualifiedIdent(p.schema, p.name)
		var before, young bool
		err := conn.QueryRow(ctx, fmt.Sprintf(`WITH x AS (SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS next)
			SELECT $1::timestamptz <= $2, EXISTS (SELECT 1 FROM %s t, x WHERE %s >= $3)`, child, written), upper, horizon, int64(mark.XMin)).Scan(&before, &young)
		if err != nil {
			var pe *pgconn.PgError
			if errors.As(err, &pe) && strings.HasPrefix(pe.Code, "22") {
				c.once("bound "+t.String(), fmt.Sprintf("retention.mode drop_partitions: the partitions of %s are not ranges of time (%s); use mode delete", t, p.bound))
				return nil
			}
			return c.failed(t, "read partition "+child, err)
		}
		if !before || young {
			continue // still in the window, or holding a row not yet delivered and old enough
		}
		err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '"+lockTimeout+"'"); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, fmt.Sprintf("ALTER TABLE %s DETACH PARTITION %s", parent, child)); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "DROP TABLE "+child)
			return err
		})
		if err != nil {
			return c.failed(t, "drop partition "+child, err)
		}
		c.Metrics.RetentionDropped(t.String())
		c.Log.Info("retention: dropped a partition whose rows are all delivered and older than retention.after", "table", t.String(), "partition", child, "upper_bound", upper)
	}
	return nil
}

// failed says what retention could not do to t, with the grant it needs
// when that is why.
func (c *Cleaner) failed(t *outbox.Source, what string, err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "42501" {
		fix := "GRANT DELETE ON " + t.String() + " TO <the connector's role>"
		if t.Retention.Mode == outbox.RetentionDropPartitions {
			fix = "make the connector's role own " + t.String() + " and its partitions (ALTER TABLE ... OWNER TO), which detaching and dropping need"
		}
		return fmt.Errorf("retention of %s: %s: %s; %s", t, what, pe.Message, fix)
	}
	if errors.As(err, &pe) && pe.Code == "55P03" {
		return fmt.Errorf("retention of %s: %s: a lock was held longer than %s; the next sweep tries again", t, what, lockTimeout)
	}
	return fmt.Errorf("retention of %s: %s: %w", t, what, err)
}

// once logs msg at warn level the first time key comes up.
func (c *Cleaner) once(key, msg string) {
	if !c.warned[key] {
		c.warned[key] = true
		c.Log.Warn(msg)
	}
}
