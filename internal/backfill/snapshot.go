package backfill

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/decode"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/postgres"
	"github.com/outboxcdc/cdc/internal/tableread"
)

// Snapshot reads every row of one table in a snapshot of its own, chunk by
// chunk, on a connection of its own: the rows a recreated table received
// before it was published again. Its snapshot is taken when it opens, and
// held, in a read-only repeatable read transaction, until Close.
type Snapshot struct {
	// mu guards conn: the watch may close a snapshot (a repair dropped)
	// while the session reads it; a read in progress ends first.
	mu    sync.Mutex
	conn  *pgx.Conn
	plan  *tableread.Plan
	cur   *tableread.Cursor // in commit order
	dec   *decode.RowDecoder
	after []string
	final bool
	// Total is how many rows the snapshot holds.
	Total int64
	// Seen is what the snapshot shows of the transactions that
	// committed: the stream passes over a repaired table's events of
	// those, since the snapshot sent them.
	Seen checkpoint.Seen
}

// OpenSnapshot opens a snapshot of table t's rows.
func (r *Runner) OpenSnapshot(ctx context.Context, t *outbox.Source) (*Snapshot, error) {
	conn, err := postgres.ConnectRows(ctx, r.Postgres, r.StatementTimeout)
	if err != nil {
		return nil, err
	}
	s := &Snapshot{conn: conn}
	if _, err := conn.Exec(ctx, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"); err != nil {
		s.Close(ctx)
		return nil, fmt.Errorf("open a snapshot of %s: %w", t, err)
	}
	if err := tableread.SetRole(ctx, conn, r.ReaderRole); err != nil {
		s.Close(ctx)
		return nil, err
	}
	// The lock's read takes the transaction's snapshot, and may then wait
	// for a rewrite or a partition change that would read as fewer rows.
	if err := tableread.HoldFiles(ctx, conn, t); err != nil {
		s.Close(ctx)
		return nil, err
	}
	// The transaction's snapshot, which the lock's read took.
	err = conn.QueryRow(ctx, `SELECT pg_snapshot_xmin(s)::text::bigint, pg_snapshot_xmax(s)::text::bigint,
		array(SELECT x::text::bigint FROM pg_snapshot_xip(s) x) FROM pg_current_snapshot() s`).Scan(&s.Seen.Xmin, &s.Seen.Xmax, &s.Seen.Xip)
	if err != nil {
		s.Close(ctx)
		return nil, fmt.Errorf("open a snapshot of %s: read what it shows: %w", t, err)
	}
	// The leaves the snapshot shows: one attached after it is not read
	// (tableread.SnapshotLeaves).
	leaves, err := tableread.SnapshotLeaves(ctx, conn, t)
	if err != nil {
		s.Close(ctx)
		return nil, err
	}
	if s.plan, s.dec, err = r.plan(ctx, conn, checkpoint.Job{ID: "repair", Table: t.String(), Leaves: leaves}); err != nil {
		s.Close(ctx)
		return nil, err
	}
	if s.Total, err = s.plan.Count(ctx, conn); err != nil {
		s.Close(ctx)
		return nil, err
	}
	r.logOrder("the repair of a recreated table", s.plan)
	if s.plan.InCommitOrder() {
		if s.cur, err = s.plan.Open(ctx, conn, nil, 0, false); err != nil {
			s.Close(ctx)
			return nil, err
		}
	}
	return s, nil
}

// Next reads the next chunk of rows, in the plan's order (the order the
// rows were committed in, unless backfill.order_by says otherwise); final
// once no row is left.
func (s *Snapshot) Next(ctx context.Context) (rows [][][]byte, final bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.final {
		return nil, true, nil
	}
	if s.conn == nil {
		return nil, false, errors.New("read a repair's snapshot: it was closed")
	}
	read := func() (tableread.Chunk, error) { return s.plan.Read(ctx, s.conn, s.after, nil) }
	if s.cur != nil {
		read = func() (tableread.Chunk, error) { return s.cur.Next(ctx) }
	}
	c, err := read()
	if err != nil {
		return nil, false, err
	}
	if c.Last != nil {
		s.after = c.Last
	}
	s.final = c.Final
	return c.Rows, c.Final, nil
}

// Decoder turns the rows Next reads into events.
func (s *Snapshot) Decoder() *decode.RowDecoder { return s.dec }

// Close ends the snapshot's transaction and connection.
func (s *Snapshot) Close(ctx context.Context) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn != nil {
		s.conn.Close(context.WithoutCancel(ctx))
		s.conn = nil
	}
}

// NewID is a random identifier, for a repair.
func NewID() string { return newID() }
