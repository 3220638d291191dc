package ops

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxcdc/cdc/internal/errtext"
	"github.com/outboxcdc/cdc/internal/metrics"
	"github.com/outboxcdc/cdc/internal/postgres"
	"github.com/outboxcdc/cdc/internal/setup"
)

// pollEvery is how often the slot's lag and retained WAL are read for the
// metrics.
const pollEvery = 5 * time.Second

// WatchSlots reads the slots' positions from Postgres into m, the
// metrics, until ctx ends. The pipeline runs it while it runs, whether it
// streams or waits: lag and retained WAL matter most when nothing streams.
func (o *Ops) WatchSlots(ctx context.Context, m *metrics.Metrics) {
	read := func(ctx context.Context, conn *pgx.Conn) error { return o.readSlots(ctx, conn, m) }
	postgres.Every(ctx, o.Config.Postgres, pollEvery, true, read, func(err error) {
		o.Log.Debug("metrics: cannot read the slot; retrying", "error", errtext.OneLine(err))
	})
}

func (o *Ops) readSlots(ctx context.Context, conn *pgx.Conn, m *metrics.Metrics) error {
	st, err := setup.InspectSlot(ctx, conn, o.Config.Postgres.Slot)
	if err != nil {
		return err
	}
	if st.Exists {
		m.LagBytes.Set(float64(st.Lag()))
		m.RetainedWAL.Set(float64(st.Retained()))
		m.ConfirmedLSN.Set(float64(st.ConfirmedFlush))
		m.SetWALStatus(st.WALStatus)
	}
	if o.Config.Replay.Window > 0 {
		rs, err := setup.InspectSlot(ctx, conn, o.Config.ReplaySlot())
		if err != nil {
			return err
		}
		m.ReplayRetained.Set(float64(rs.Retained()))
	}
	return nil
}
