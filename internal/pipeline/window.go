package pipeline

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/errtext"
	"github.com/outboxcdc/cdc/internal/wal"
)

// keepWindow keeps the replay slot about replay.window behind: at every
// mark interval it advances the slot to the newest replay mark older than
// the window (docs/design.md, rule 17), so retained WAL stays near the
// window and no more. It runs beside a session and stops with ctx.
//
// The order matters: the window is recorded in a checkpoint first and the
// slot advanced only once that checkpoint is in Kafka, so the slot is never
// ahead of the window a checkpoint claims, and a replay that trusts the
// checkpoint never starts past what the slot still holds.
func (p *Pipeline) keepWindow(ctx context.Context) {
	every := min(checkpoint.MarkEvery(p.cfg.Replay.Window), time.Minute)
	t := time.NewTicker(every)
	defer t.Stop()
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(context.WithoutCancel(ctx))
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if conn == nil {
			c, err := wal.ConnectSQL(ctx, p.cfg.Postgres)
			if err != nil {
				p.log.Warn("replay window: cannot connect to postgres; retrying", "error", errtext.OneLine(err))
				continue
			}
			conn = c
		}
		if err := p.advanceWindow(ctx, conn); err != nil && ctx.Err() == nil {
			p.log.Warn("replay window: not advanced; retrying", "slot", p.cfg.ReplaySlot(), "error", errtext.OneLine(err))
			conn.Close(context.WithoutCancel(ctx))
			conn = nil
		}
	}
}

func (p *Pipeline) advanceWindow(ctx context.Context, conn *pgx.Conn) error {
	name := p.cfg.ReplaySlot()
	st, err := wal.InspectSlot(ctx, conn, name)
	if err != nil {
		return err
	}
	if !st.Exists || st.WALStatus == "lost" {
		// Postgres invalidated the slot (max_slot_wal_keep_size), or
		// someone dropped it: the window is gone. Say so loudly, start a
		// new one, and let the main stream go on.
		p.m.WindowsLost.Inc()
		p.log.Error("replay window lost: the replay slot is gone or invalidated, so replays can only reach back to now; raise max_slot_wal_keep_size above the WAL the window needs, or shorten replay.window",
			"slot", name, "wal_status", st.WALStatus, "window", p.cfg.Replay.Window)
		return p.recreateReplaySlot(ctx, conn, st.Exists)
	}
	// Advance to the window the last checkpoint claims, then ask the next
	// checkpoint to claim a newer one: the newest replay mark older than
	// the window. Every transaction that committed Skew after a mark's
	// time has its commit record after the mark.
	saved := p.progress.Saved()
	if target, ok := saved.Marks.Before(time.Now().Add(-p.cfg.Replay.Window)); ok && target.LSN > saved.Window.LSN {
		p.progress.SetWindow(checkpoint.Mark{LSN: target.LSN, Time: target.Time.Add(checkpoint.Skew)})
	}
	if saved.Window.LSN <= st.ConfirmedFlush {
		return nil
	}
	var to string
	if err := conn.QueryRow(ctx, `SELECT end_lsn::text FROM pg_replication_slot_advance($1, $2::pg_lsn)`, name, saved.Window.LSN.String()).Scan(&to); err != nil {
		return fmt.Errorf("advance replay slot %q to %s: %w", name, saved.Window.LSN, err)
	}
	if p.log.IsDebug() {
		p.log.Debug("replay window advanced", "slot", name, "lsn", to, "from_time", saved.Window.Time.UTC().Format(time.RFC3339))
	}
	return nil
}
