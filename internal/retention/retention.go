package retention

import (
	"context"
	"errors"
	"fmt"
	"github.com/jackc/pglogrepl"
	"slices"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/errtext"
	"github.com/outboxcdc/cdc/internal/metrics"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/postgres"
)

// Cleaner deletes what the tables' retention allows, beside the stream.
// Its fields are the pipeline's; Marks and SetMarks keep its marks in the
// checkpoint, so that a restart does not start counting ages afresh.
type Cleaner struct {
	Postgres postgres.Config
	Tables   []*outbox.Source // the tables with Retention
	// Saved is the saved checkpoint: what Kafka acknowledged (Confirmed),
	// what the stream covered of each table (Tables), and the WAL history
	// (SystemID, Timeline) they belong to.
	Saved func() checkpoint.Record
	// Pending reports whether an unfinished backfill job reads the table
	// (as SQL names it).
	Pending func(table string) bool
	// Marks are the marks the saved checkpoint holds; SetMarks hands the
	// new list to the next checkpoints.
	Marks    []checkpoint.RetentionMark
	SetMarks func([]checkpoint.RetentionMark)
	// Pause is the wait between two batches of one table: the deletes'
	// WAL goes through the walsender the stream reads. Default 200ms.
	Pause time.Duration
	// Now is the clock marks are dated by and ages measured with. Default
	// time.Now; a test moves it to run a retention.after of days.
	Now func() time.Time
	// Interval is the time between two sweeps. Default: a fraction of the
	// shortest retention.after, at least half a second and at most a
	// minute (interval).
	Interval time.Duration
	Log      hclog.Logger
	Metrics  *metrics.Metrics

	warned map[string]bool
	// bounds are coveredCTE's below, by the pg_inherits row they bound
	// (attachBounds).
	bounds map[attachLink]int64
	// afterLook, when set, runs between the look at a partition without a
	// lock and its drop: tests write a late row there.
	afterLook func(partition string)
}

// New is c for the tables of c.Tables that have retention, with the marks
// the saved checkpoint holds; nil when none has: the cleaner deletes only
// what the saved checkpoint says the stream covered and Kafka
// acknowledged, and keeps its marks in the checkpoint.
func New(c Cleaner) *Cleaner {
	var tables []*outbox.Source
	for _, t := range c.Tables {
		if t.Retention != nil {
			tables = append(tables, t)
		}
	}
	if len(tables) == 0 {
		return nil
	}
	c.Tables, c.Marks = tables, slices.Clone(c.Saved().RetentionMarks)
	return &c
}

// lockTimeout bounds how long a batch waits for a lock an application
// holds on a row or the table: the batch gives way, and runs again later.
const lockTimeout = "1s"

// interval is how often marks are taken and tables swept: a quarter of
// the shortest retention.after, at least half a second and at most a
// minute. Marks are kept by age (prune), so a long after needs no longer
// interval.
func (c *Cleaner) interval() time.Duration {
	if c.Interval > 0 {
		return c.Interval
	}
	short := time.Duration(0)
	for _, t := range c.Tables {
		if a := t.Retention.After; short == 0 || a < short {
			short = a
		}
	}
	return min(max(short/4, time.Second/2), time.Minute)
}

// Run sweeps at once and then every interval until ctx ends.
func (c *Cleaner) Run(ctx context.Context) {
	if len(c.Tables) == 0 {
		return
	}
	t := time.NewTicker(c.interval())
	defer t.Stop()
	for {
		if err := c.Sweep(ctx); err != nil && ctx.Err() == nil {
			c.Log.Warn("retention: trying again later", "error", errtext.OneLine(err))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Sweep takes a mark, then deletes, table by table, what the facts allow
// (facts.go). It connects anew each time, to the server that can write
// now (postgres.primary_url is looked up at each sweep): after a
// promotion, the old primary is left.
func (c *Cleaner) Sweep(ctx context.Context) error {
	if c.Pause == 0 {
		c.Pause = 200 * time.Millisecond
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.warned == nil {
		c.warned = map[string]bool{}
	}
	conn, own, err := c.connect(ctx)
	if err != nil || conn == nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	saved := c.Saved()
	srv, mark, err := c.take(ctx, conn, own, saved)
	if err != nil || mark == nil {
		return err
	}
	marks, dropped := valid(append(c.Marks, *mark), srv)
	if dropped > 0 {
		c.Log.Warn("retention: dropped marks that do not fit the server's WAL history (a restore from a backup, a promotion, or a record someone else wrote): ages are counted afresh from now",
			"dropped", dropped, "timeline", srv.Timeline)
	}
	c.Marks = marks
	var errs []error
	var notAfter []time.Time
	for _, t := range c.Tables {
		horizon := srv.Now.Add(-t.Retention.After)
		if t.Retention.Mode == outbox.RetentionDropPartitions {
			notAfter = append(notAfter, srv.Now) // a partition's age is its range's bound
		} else {
			notAfter = append(notAfter, horizon)
		}
		if err := c.table(ctx, conn, t, saved, notAfter[len(notAfter)-1], horizon); err != nil {
			c.Metrics.RetentionError(t.String())
			errs = append(errs, err)
			continue
		}
		c.Metrics.RetentionRan(t.String(), srv.Now)
	}
	c.Marks = prune(c.Marks, usableUpTo(saved), notAfter)
	if c.SetMarks != nil {
		c.SetMarks(append([]checkpoint.RetentionMark(nil), c.Marks...))
	}
	return errors.Join(errs...)
}

// usableUpTo is the position up to which retention may use a mark: the
// saved checkpoint's confirmed position, and while any key is parked,
// none. A parked event's row is kept until its key is redriven: its parked
// copy is a claim a redrive checks (docs/operations.md, "Parked keys"),
// and should it fail, the rows are what the key's events are recovered
// from; a parked key holds events of every table with that key, and
// events committed before its parking began (a backfill's) may be parked
// behind it, so no row of any table is deleted meanwhile.
func usableUpTo(saved checkpoint.Record) pglogrepl.LSN {
	if len(saved.Parked) > 0 {
		return 0
	}
	return saved.Confirmed
}

// connect opens a connection to the server that can write now: the one
// postgres.url reaches (own: the server the stream decodes on), or while
// that is a hot standby, postgres.primary_url's; nil on a standby without
// one, where nothing can be deleted.
func (c *Cleaner) connect(ctx context.Context) (conn *pgx.Conn, own bool, err error) {
	conn, err = postgres.ConnectSQL(ctx, c.Postgres)
	if err != nil {
		return nil, false, err
	}
	standby, err := postgres.InRecovery(ctx, conn)
	if err != nil || !standby {
		if err != nil {
			conn.Close(context.WithoutCancel(ctx))
			return nil, false, err
		}
		return conn, true, nil
	}
	conn.Close(context.WithoutCancel(ctx))
	if c.Postgres.PrimaryURL == "" {
		c.once("standby", "retention deletes on the primary: postgres.url is a hot standby, where nothing can be deleted; set postgres.primary_url")
		return nil, false, nil
	}
	conn, err = postgres.ConnectPrimary(ctx, c.Postgres, "delete what retention allows", "")
	return conn, false, err
}

// take reads the server's WAL history and takes a mark on it; no mark
// where the server is not the stream's: another database system, or,
// reached through postgres.primary_url, another timeline than the
// stream's (a primary the stream's standby no longer follows). The
// stream's own server, promoted since the session began, is on a new
// timeline that its marks carry from then on.
func (c *Cleaner) take(ctx context.Context, conn *pgx.Conn, own bool, saved checkpoint.Record) (Server, *checkpoint.RetentionMark, error) {
	var sys string
	var srv Server
	var m checkpoint.RetentionMark
	// The snapshot is the statement's, taken before the WAL position is
	// read: every transaction below its xmin ended before that position.
	err := conn.QueryRow(ctx, `SELECT (SELECT system_identifier FROM pg_control_system())::text,
		('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int,
		pg_snapshot_xmin(pg_current_snapshot())::text::bigint, pg_snapshot_xmax(pg_current_snapshot())::text::bigint,
		pg_current_wal_insert_lsn()`).Scan(&sys, &srv.Timeline, &m.XMin, &srv.NextXID, &m.LSN)
	if err != nil {
		return Server{}, nil, fmt.Errorf("take a retention mark: %w", err)
	}
	srv.WALEnd, srv.Now = m.LSN, c.Now()
	switch {
	case sys != saved.SystemID:
		c.once("system", fmt.Sprintf("retention deletes nothing: the server it reaches to delete is database system %s, and the stream's is %s; point postgres.primary_url at the stream's primary", sys, saved.SystemID))
		return srv, nil, nil
	case !own && srv.Timeline != saved.Timeline:
		c.once(fmt.Sprintf("timeline %d", srv.Timeline), fmt.Sprintf("retention waits: postgres.primary_url's server is on timeline %d and the stream's on %d (a primary the stream's standby does not follow)", srv.Timeline, saved.Timeline))
		return srv, nil, nil
	}
	m.Time, m.Timeline = srv.Now, srv.Timeline
	return srv, &m, nil
}

// table sweeps one table: with the newest mark taken at or before
// notAfter whose position the saved checkpoint confirmed, what the
// table's mode allows.
func (c *Cleaner) table(ctx context.Context, conn *pgx.Conn, t *outbox.Source, saved checkpoint.Record, notAfter, horizon time.Time) error {
	st, ok := saved.Tables[t.String()]
	if !ok || st.Floor == checkpoint.NoFloor || st.Member == "" {
		c.once("unknown "+t.String(), "retention of "+t.String()+" waits until the stream has covered the table: nothing in the checkpoint says yet which of its rows Kafka holds")
		return nil
	}
	// Before any wait: the bounds are the tighter the sooner they are read.
	bounds, err := c.attachBounds(ctx, conn, st)
	if err != nil {
		return c.failed(t, "read its partitions", err)
	}
	if c.Pending != nil && c.Pending(t.String()) {
		c.once("backfill "+t.String(), "retention of "+t.String()+" waits while a backfill of it runs: the job may still have to read its rows")
		return nil
	}
	if len(saved.Parked) > 0 {
		c.once("parked", "retention deletes nothing while keys are parked: their rows are kept until cdc redrive sends them on (cdc parked lists them)")
		return nil
	}
	mark, ok := newest(c.Marks, notAfter, usableUpTo(saved))
	if !ok {
		return nil
	}
	names, err := rewrittenLeaves(ctx, conn, st)
	if err != nil {
		return c.failed(t, "read its partitions", err)
	}
	if names != "" {
		c.once("rewritten "+t.String()+names, fmt.Sprintf("retention keeps the rows partitions %s of %s held when they were last rewritten or altered after they were attached (ALTER TABLE ... TYPE, a volatile default, VACUUM FULL, CLUSTER, TRUNCATE, then any change of their columns or options): a table attached with rows never had them streamed, and a rewrite gives rows a new transaction id, so they cannot be told from streamed ones; send them with cdc backfill if they are events, then delete them, or drop the partition, yourself", names, t))
	}
	if t.Retention.Mode == outbox.RetentionDropPartitions {
		err = c.dropPartitions(ctx, conn, t, st, mark, bounds, horizon)
	} else {
		err = c.delete(ctx, conn, t, st, mark, bounds)
	}
	var changed *errChanged
	if errors.As(err, &changed) {
		c.once("changed "+t.String()+changed.why, fmt.Sprintf("retention of %s deletes nothing for now: %s; it goes on once the stream has covered the table again", t, changed.why))
		return nil
	}
	return err
}

// delete deletes t's rows that mark and the facts allow, in batches, each
// a transaction that checks the facts under its lock (facts.go).
func (c *Cleaner) delete(ctx context.Context, conn *pgx.Conn, t *outbox.Source, st checkpoint.Table, mark checkpoint.RetentionMark, bounds string) error {
	total := int64(0)
	for ctx.Err() == nil {
		var n int64
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '"+lockTimeout+"'"); err != nil {
				return err
			}
			name, err := lockCovered(ctx, tx, c.Postgres.Publication, st, "ROW EXCLUSIVE")
			if err != nil {
				return err
			}
			// ONLY a table that is not partitioned: one that inherits from
			// it is no outbox (docs/design.md, "A table that inherits from
			// the outbox"), and a lock on it, or a foreign one that cannot
			// be scanned, must not hold the outbox's retention. Its rows
			// were never deletable (covered).
			var part bool
			if err := tx.QueryRow(ctx, `SELECT relkind = 'p' FROM pg_class WHERE oid = $1::oid`, st.Rel).Scan(&part); err != nil {
				return err
			}
			from := name
			if !part {
				from = "ONLY " + name
			}
			// tableoid with ctid: a partitioned table's partitions each
			// number their own rows.
			q := fmt.Sprintf(`WITH %s,
				doomed AS (SELECT t.tableoid, t.ctid FROM %s t CROSS JOIN x LEFT JOIN lf ON lf.leaf = t.tableoid WHERE %s LIMIT $4)
				DELETE FROM %s d USING doomed WHERE d.tableoid = doomed.tableoid AND d.ctid = doomed.ctid`, coveredCTE(bounds), from, deletable, from)
			tag, err := tx.Exec(ctx, q, st.Rel, int64(mark.XMin), int64(st.Floor), t.Retention.BatchSize)
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

// failed says what retention could not do to t, with the grant it needs
// when that is why. A fact that no longer holds is passed on as it is.
func (c *Cleaner) failed(t *outbox.Source, what string, err error) error {
	var changed *errChanged
	if errors.As(err, &changed) {
		return err
	}
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
