package pipeline

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/outboxcdc/cdc/internal/errtext"
	"github.com/outboxcdc/cdc/internal/replay"
	"github.com/outboxcdc/cdc/internal/sink"
	"github.com/outboxcdc/cdc/internal/tablewatch"
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

	k, err := sink.New(p.cfg.Producer(), p.log.Named("kafka"), p.kafkaOpts()...)
	if err != nil {
		return replay.Summary{}, err
	}
	defer k.Close()
	stream, err := conn.Start(ctx, tmp, start)
	if err != nil {
		return replay.Summary{}, err
	}
	s := &session{p: p, kafka: k, tracker: p.newTracker(start), replay: f, ctx: ctx}
	pt := &tablewatch.Partitions{Postgres: p.cfg.Postgres, Tables: p.cfg.Tables}
	defer pt.Close(ctx)
	s.dec = s.newDecoder(pt, nil)
	s.out = s.newSender()
	acks := replay.NewAcks(s.tracker, f)

	report := func() replay.Status { return f.Progress(start, s.tracker.Acked()) }
	stopReports := replay.Report(progress, report)
	runErr := stream.Run(ctx, s.handle, acks, k)
	if errors.Is(runErr, replay.ErrDone) {
		runErr = nil
		// Every event is produced: wait for Kafka to acknowledge them.
		if err := k.Flush(ctx); err != nil {
			runErr = fmt.Errorf("wait for kafka's acks: %w", err)
		} else if err := s.tracker.Err(); err != nil {
			runErr = err
		}
	}
	stopReports()
	stream.Close(context.WithoutCancel(ctx), acks)
	sum := f.Summary(report(), time.Since(started))
	if progress != nil {
		progress(sum.Status)
	}
	if runErr == nil && ctx.Err() != nil {
		runErr = ctx.Err()
	}
	return sum, runErr
}
