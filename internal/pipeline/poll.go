package pipeline

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxcdc/cdc/internal/errtext"
	"github.com/outboxcdc/cdc/internal/wal"
)

// pollEvery is how often the slot's lag and retained WAL are read for the
// metrics.
const pollEvery = 5 * time.Second

// pollSlot reads the slots' positions from Postgres for the metrics, while
// Run runs, whether this instance streams or waits: lag and retained WAL
// matter most when nothing streams.
func (p *Pipeline) pollSlot(ctx context.Context) {
	t := time.NewTicker(pollEvery)
	defer t.Stop()
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(context.WithoutCancel(ctx))
		}
	}()
	for {
		if conn == nil {
			conn, _ = wal.ConnectSQL(ctx, p.cfg.Postgres)
		}
		if conn != nil {
			if err := p.readSlots(ctx, conn); err != nil {
				p.log.Debug("metrics: cannot read the slot; retrying", "error", errtext.OneLine(err))
				conn.Close(context.WithoutCancel(ctx))
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

func (p *Pipeline) readSlots(ctx context.Context, conn *pgx.Conn) error {
	st, err := wal.InspectSlot(ctx, conn, p.cfg.Postgres.Slot)
	if err != nil {
		return err
	}
	if st.Exists {
		p.m.LagBytes.Set(float64(st.Lag()))
		p.m.RetainedWAL.Set(float64(st.Retained()))
		p.m.ConfirmedLSN.Set(float64(st.ConfirmedFlush))
		p.m.SetWALStatus(st.WALStatus)
	}
	if p.cfg.Replay.Window > 0 {
		rs, err := wal.InspectSlot(ctx, conn, p.cfg.ReplaySlot())
		if err != nil {
			return err
		}
		p.m.ReplayRetained.Set(float64(rs.Retained()))
	}
	return nil
}
