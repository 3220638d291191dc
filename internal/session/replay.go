package session

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pglogrepl"

	"github.com/outboxcdc/cdc/internal/leaf"
	"github.com/outboxcdc/cdc/internal/replay"
	"github.com/outboxcdc/cdc/internal/sink"
	"github.com/outboxcdc/cdc/internal/wal"
)

// Replay is a replay's session (pipeline.Pipeline.Replay): it takes
// stream, started at start on a copy of the replay slot, through the same
// decoding, routing and formats as the connector's sessions, sends on k
// what f selects until f's end, and waits until Kafka acknowledged every
// event. It has no checkpoint, no tables' watch, nothing parked (f holds
// back the events of the keys parked when it began) and no
// background tasks: d's Config, Log, Metrics, Router, Schemas, Jobs,
// counters and OnDelivered are what it uses. progress, if set, is called
// about four times a second from another goroutine. It closes stream and
// returns the replay's last status.
func Replay(ctx context.Context, d Deps, k *sink.Kafka, stream *wal.Stream, start pglogrepl.LSN, f *replay.Filter, progress func(replay.Status)) (replay.Status, error) {
	s := &session{d: d, kafka: k, tracker: newTracker(d.Config, start), replay: f, ctx: ctx}
	pt := &leaf.Finder{Postgres: d.Config.Postgres, Tables: d.Config.Tables}
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
	return report(), runErr
}
