package backfill

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/decode"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/postgres"
)

// Snapshot reads every row of one table in a snapshot of its own, chunk by
// chunk, on a connection of its own: the rows a recreated table received
// before it was published again. Its snapshot is taken when it opens, and
// held, in a read-only repeatable read transaction, until Close.
type Snapshot struct {
	conn  *pgx.Conn
	plan  *Plan
	dec   *decode.RowDecoder
	after []string
	final bool
	// Total is how many rows the snapshot holds.
	Total int64
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
	if err := setRole(ctx, conn, r.ReaderRole); err != nil {
		s.Close(ctx)
		return nil, err
	}
	// The lock's read takes the transaction's snapshot, and may then wait
	// for a rewrite or a partition change that would read as fewer rows.
	if err := holdFiles(ctx, conn, t); err != nil {
		s.Close(ctx)
		return nil, err
	}
	if s.plan, s.dec, err = r.plan(ctx, conn, checkpoint.Job{ID: "repair", Table: t.String()}); err != nil {
		s.Close(ctx)
		return nil, err
	}
	if s.Total, err = s.plan.Count(ctx, conn); err != nil {
		s.Close(ctx)
		return nil, err
	}
	return s, nil
}

// Next reads the next chunk of rows, in the plan's key order; final once
// no row is left.
func (s *Snapshot) Next(ctx context.Context) (rows [][][]byte, final bool, err error) {
	if s.final {
		return nil, true, nil
	}
	c, err := s.plan.Read(ctx, s.conn, s.after, nil)
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
	if s.conn != nil {
		s.conn.Close(context.WithoutCancel(ctx))
		s.conn = nil
	}
}

// NewID is a random identifier, for a repair.
func NewID() string { return newID() }
