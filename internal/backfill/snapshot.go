package backfill

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/decode"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/postgres"
	"github.com/outboxcdc/cdc/internal/tableread"
)

// OpenSnapshot opens a snapshot of table t's rows for a repair
// (tableread.Snapshot).
func (r *Runner) OpenSnapshot(ctx context.Context, t *outbox.Source) (*tableread.Snapshot, error) {
	return tableread.OpenSnapshot(ctx, r.snapshotDeps(), t)
}

// NewSnapshot connects a snapshot of table t's rows for a repair, to begin
// in another transaction's (tableread.NewSnapshot).
func (r *Runner) NewSnapshot(ctx context.Context, t *outbox.Source) (*tableread.Snapshot, error) {
	return tableread.NewSnapshot(ctx, r.snapshotDeps(), t)
}

func (r *Runner) snapshotDeps() tableread.SnapshotDeps {
	return tableread.SnapshotDeps{
		Connect: func(ctx context.Context) (*pgx.Conn, error) {
			return postgres.ConnectRows(ctx, r.Postgres, r.StatementTimeout)
		},
		Role: r.ReaderRole,
		Plan: func(ctx context.Context, conn *pgx.Conn, t *outbox.Source, leaves []uint32) (*tableread.Plan, *decode.RowDecoder, error) {
			plan, dec, err := r.plan(ctx, conn, checkpoint.Job{ID: "repair", Table: t.String(), Leaves: leaves})
			if err == nil {
				r.logOrder("the repair of a recreated table", plan)
			}
			return plan, dec, err
		},
	}
}

// NewID is a random identifier, for a repair.
func NewID() string { return newID() }
