package replay

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/delivery"
	"github.com/outboxcdc/cdc/internal/errtext"
	"github.com/outboxcdc/cdc/internal/metrics"
	"github.com/outboxcdc/cdc/internal/postgres"
	"github.com/outboxcdc/cdc/internal/setup"
	"github.com/outboxcdc/cdc/internal/wal"
)

// Window keeps the replay window: a second slot, ReplaySlot, about Length
// behind the main slot, so that Postgres retains the WAL replays and rewinds
// read (docs/design.md, "Replay needs WAL kept on purpose"). Its fields are the
// pipeline's.
type Window struct {
	Postgres   postgres.Config
	Slot       string        // the main slot
	ReplaySlot string        // the window's slot
	Length     time.Duration // replay.window; 0: no window
	// Progress is the session's checkpoint state: the window a checkpoint
	// claims is read from it and set in it.
	Progress *delivery.Progress
	Log      hclog.Logger
	Metrics  *metrics.Metrics
}

// Prepare creates the replay slot, as a copy of the main slot, when a
// replay window is configured and the slot is missing; without a window it
// drops a replay slot left from an earlier configuration, which would
// otherwise retain WAL for nothing. mainAt is the main slot's position.
func (w *Window) Prepare(ctx context.Context, mainAt pglogrepl.LSN) error {
	conn, err := postgres.ConnectSQL(ctx, w.Postgres)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	name := w.ReplaySlot
	st, err := setup.InspectSlot(ctx, conn, name)
	if err != nil {
		return err
	}
	if w.Length == 0 {
		if st.Exists {
			if _, err := conn.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, name); err != nil {
				return fmt.Errorf("drop replay slot %q: %w", name, err)
			}
			w.Log.Warn("replay.window is not set: dropped the replay slot and its retained WAL", "slot", name)
		}
		return nil
	}
	if st.Exists && st.WALStatus != "lost" {
		if w.Progress.Saved().Window.LSN == 0 {
			// The slot exists but no saved checkpoint claims its window
			// (the session that made it ended before one was written):
			// claim it from now, or Keep would never advance it and it
			// would retain WAL for good. Transactions committed from now
			// on are past its position.
			w.Progress.SetWindow(checkpoint.Mark{LSN: st.ConfirmedFlush, Time: time.Now()})
		}
		w.Log.Info("replay window", "slot", name, "window", w.Length, "from_lsn", st.ConfirmedFlush.String(),
			"retained_wal_bytes", int64(mainAt)-int64(st.RestartLSN))
		return nil
	}
	if st.Exists {
		w.lost(st) // invalidated while the connector was stopped
	}
	return w.recreate(ctx, conn, st.Exists)
}

// recreate copies the main slot to the replay slot; the window starts now.
func (w *Window) recreate(ctx context.Context, conn *pgx.Conn, drop bool) error {
	name := w.ReplaySlot
	if drop {
		if _, err := conn.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, name); err != nil {
			return fmt.Errorf("drop lost replay slot %q: %w", name, err)
		}
	}
	if _, err := conn.Exec(ctx, `SELECT pg_copy_logical_replication_slot($1, $2)`, w.Slot, name); err != nil {
		return fmt.Errorf("create replay slot %q as a copy of %q: %w", name, w.Slot, err)
	}
	st, err := setup.InspectSlot(ctx, conn, name)
	if err != nil {
		return err
	}
	// Transactions that commit from now on are in the window.
	w.Progress.SetWindow(checkpoint.Mark{LSN: st.ConfirmedFlush, Time: time.Now()})
	w.Log.Info("created the replay slot; the replay window starts now", "slot", name, "lsn", st.ConfirmedFlush.String(), "window", w.Length)
	return nil
}

// Keep keeps the replay slot about Length behind: at every mark interval
// it advances the slot to the newest replay mark older than the window, so
// retained WAL stays near the window and no more. It runs beside a session
// and stops with ctx.
//
// The order matters: the window is recorded in a checkpoint first and the
// slot advanced only once that checkpoint is in Kafka, so the slot is never
// ahead of the window a checkpoint claims, and a replay that trusts the
// checkpoint never starts past what the slot still holds.
func (w *Window) Keep(ctx context.Context) {
	every := min(delivery.MarkEvery(w.Length), time.Minute)
	postgres.Every(ctx, w.Postgres, every, false, w.advance, func(err error) {
		w.Log.Warn("replay window: not advanced; retrying", "slot", w.ReplaySlot, "error", errtext.OneLine(err))
	})
}

func (w *Window) advance(ctx context.Context, conn *pgx.Conn) error {
	name := w.ReplaySlot
	st, err := setup.InspectSlot(ctx, conn, name)
	if err != nil {
		return err
	}
	if !st.Exists || st.Lost() != nil {
		// Postgres invalidated the slot, or someone dropped it: the
		// window is gone. Say so loudly, start a new one, and let the
		// main stream go on.
		w.lost(st)
		return w.recreate(ctx, conn, st.Exists)
	}
	// Advance to the window the last checkpoint claims, then ask the next
	// checkpoint to claim a newer one: the newest replay mark older than
	// the window. Every transaction that committed Skew after a mark's
	// time has its commit record after the mark.
	saved := w.Progress.Saved()
	if target, ok := saved.Marks.Before(time.Now().Add(-w.Length)); ok && target.LSN > saved.Window.LSN {
		w.Progress.SetWindow(checkpoint.Mark{LSN: target.LSN, Time: target.Time.Add(checkpoint.Skew)})
	}
	if saved.Window.LSN <= st.ConfirmedFlush {
		return nil
	}
	var to string
	if err := conn.QueryRow(ctx, `SELECT end_lsn::text FROM pg_replication_slot_advance($1, $2::pg_lsn)`, name, saved.Window.LSN.String()).Scan(&to); err != nil {
		return fmt.Errorf("advance replay slot %q to %s: %w", name, saved.Window.LSN, err)
	}
	if w.Log.IsDebug() {
		w.Log.Debug("replay window advanced", "slot", name, "lsn", to, "from_time", saved.Window.Time.UTC().Format(time.RFC3339))
	}
	return nil
}

// lost counts and logs the loss of the window whose slot is st, gone or
// invalidated, with why and what keeps the next one.
func (w *Window) lost(st setup.SlotState) {
	w.Metrics.WindowsLost.Inc()
	w.Log.Error("replay window lost: "+windowLost(st, w.Length),
		"slot", w.ReplaySlot, "wal_status", st.WALStatus, "invalidation_reason", st.Invalidated, "window", w.Length)
}

// windowLost says why the replay slot st is gone or invalidated, and
// what keeps the next window.
func windowLost(st setup.SlotState, window time.Duration) string {
	const now = "so replays can only reach back to now"
	lost := st.Lost()
	switch {
	case !st.Exists:
		return "the replay slot is gone (dropped), " + now + "; the connector keeps it: do not drop it"
	case lost.Reason == postgres.ReasonWALRemoved:
		return lost.Cause + ", " + now + "; raise max_slot_wal_keep_size above the WAL the window needs, or shorten replay.window"
	case lost.Reason == postgres.ReasonIdleTimeout:
		// Nothing streams from the replay slot: it moves only when the
		// window has passed, so it sits idle for the window by design.
		return fmt.Sprintf("%s (the replay slot sits idle for the window, %s, by design), %s; set idle_replication_slot_timeout above the window plus the longest stop, or turn it off (0)", lost.Cause, window, now)
	}
	return lost.Cause + ", " + now + "; " + lost.Fix
}

// Open copies the replay slot to a temporary slot on conn, a replication
// connection, so that the copy vanishes with the connection however the replay
// ends (docs/design.md, "Replay needs WAL kept on purpose"), and moves it to
// where r starts in the window (WindowStart). It returns the copy's name, where
// it starts, and where the replay ends: the WAL end now, or r.ToLSN. slot is
// the main slot, rec its checkpoint.
func Open(ctx context.Context, conn *wal.Conn, r Range, rec checkpoint.Record, slot, replaySlot string, window time.Duration) (tmp string, start, end pglogrepl.LSN, err error) {
	// The end: what has committed when the replay starts (or ToLSN).
	if end, err = conn.CurrentWAL(ctx); err != nil {
		return "", 0, 0, err
	}
	if r.ToLSN != 0 && r.ToLSN < end {
		end = r.ToLSN
	}
	// A name unique to this process, that says whose it is.
	tmp = slot
	if len(tmp) > 40 {
		tmp = tmp[:40]
	}
	tmp = fmt.Sprintf("%s_rp_%d", tmp, os.Getpid())
	held, err := conn.CopySlot(ctx, replaySlot, tmp, true)
	if err != nil {
		return "", 0, 0, fmt.Errorf("%w; is the connector running with replay.window set? it creates the replay slot", err)
	}
	if start, err = WindowStart(r, rec, held, window, replaySlot); err != nil {
		return "", 0, 0, err
	}
	if start <= held {
		return tmp, held, end, nil
	}
	// The server decodes its way forward, cheaper than sending it.
	if start, err = conn.AdvanceSlot(ctx, tmp, start); err != nil {
		return "", 0, 0, err
	}
	return tmp, start, end, nil
}

// Report calls progress, if set, with report() four times a second from
// another goroutine, until stop is called; stop returns once the last call
// has.
func Report(progress func(Status), report func() Status) (stop func()) {
	tick := time.NewTicker(250 * time.Millisecond)
	stopped, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		defer tick.Stop()
		for {
			select {
			case <-stopped:
				return
			case <-tick.C:
				if progress != nil {
					progress(report())
				}
			}
		}
	}()
	return func() { close(stopped); <-done }
}
