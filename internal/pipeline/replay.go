package pipeline

import (
	"context"
	"time"

	"github.com/outboxcdc/cdc/internal/errtext"
	"github.com/outboxcdc/cdc/internal/replay"
	"github.com/outboxcdc/cdc/internal/session"
	"github.com/outboxcdc/cdc/internal/sink"
	"github.com/outboxcdc/cdc/internal/wal"
)

// Replay re-sends the transactions of r from the replay window, through the
// same routing and formats, and waits until Kafka acknowledged every event. It
// runs beside the main connector: it streams a temporary copy of the replay
// slot, made on its own replication connection, so that the copy vanishes with
// the connection however the replay ends (docs/design.md, "Replay needs WAL
// kept on purpose"). progress, if set, is called about four times a second from
// another goroutine.
func (p *Pipeline) Replay(ctx context.Context, r replay.Request, progress func(replay.Status)) (replay.Summary, error) {
	started := time.Now()
	if p.cfg.Replay.Window == 0 {
		return replay.Summary{}, &errtext.Fatal{Msg: "no replay window: set replay.window (for example 24h) in the config and let the connector run; a replay reaches back only as far as the window"}
	}
	f, err := replay.NewFilter(r, p.cfg.Tables)
	if err != nil {
		return replay.Summary{}, err
	}
	conn, err := wal.Connect(ctx, p.cfg.Postgres, p.log.Named("wal"))
	if err != nil {
		return replay.Summary{}, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rec, store, err := p.Ops().LoadRecord(ctx, conn.System())
	p.store = store
	if err != nil {
		return replay.Summary{}, err
	}
	tmp, start, end, err := replay.Open(ctx, conn, r.Range, rec, p.cfg.Postgres.Slot, p.cfg.ReplaySlot(), p.cfg.Replay.Window)
	if err != nil {
		return replay.Summary{}, err
	}
	f.EndAt(end)
	f.HoldParked(rec.Parked)

	k, err := sink.New(p.cfg.Producer(), p.log.Named("kafka"), p.kafkaOpts()...)
	if err != nil {
		return replay.Summary{}, err
	}
	defer k.Close()
	stream, err := conn.Start(ctx, tmp, start)
	if err != nil {
		return replay.Summary{}, err
	}
	status, runErr := session.Replay(ctx, p.sessionDeps(), k, stream, start, f, progress)
	sum := f.Summary(status, time.Since(started))
	if progress != nil {
		progress(sum.Status)
	}
	if runErr == nil && ctx.Err() != nil {
		runErr = ctx.Err()
	}
	return sum, runErr
}
