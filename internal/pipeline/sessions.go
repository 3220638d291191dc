package pipeline

import (
	"context"
	"fmt"
	"time"

	"github.com/outboxcdc/cdc/internal/backfill"
	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/config"
	"github.com/outboxcdc/cdc/internal/delivery"
	"github.com/outboxcdc/cdc/internal/postgres"
	"github.com/outboxcdc/cdc/internal/relay"
	"github.com/outboxcdc/cdc/internal/retention"
	"github.com/outboxcdc/cdc/internal/session"
	"github.com/outboxcdc/cdc/internal/sink"
	"github.com/outboxcdc/cdc/internal/tablewatch"
	"github.com/outboxcdc/cdc/internal/wal"
)

// runSession runs one replication session: it connects to Kafka, takes
// the slot's start lock, works out where the session starts (start), and
// hands the rest to package session (session.Run), which releases the
// lock once the walsender holds the slot. What the session leaves (the
// position it confirmed, what Kafka acknowledged past its last
// checkpoint) is the pipeline's, for the stopped line and the next
// session.
func (p *Pipeline) runSession(ctx context.Context) error {
	k, err := sink.Connect(ctx, p.cfg.Producer(), p.log.Named("kafka"), p.kafkaOpts()...)
	if err != nil {
		return err
	}
	p.log.Debug("kafka: brokers answered")
	if !p.parkedChecked {
		p.parkedChecked = true
		relay.WarnParkedTopics(ctx, k, p.cfg.Tables, p.log)
		if err := relay.CheckSquatted(ctx, k, p.cfg.Checkpoint.Topic, p.cfg.ParkedTopics(), p.cfg.DeadLetterTopics()); err != nil {
			k.Close()
			return err
		}
	}
	defer func() { k.Close() }() // the transactional producer replaces it
	var opening *checkpoint.Opening
	if p.store == nil {
		// The checkpoint topic's round trips overlap with Postgres's;
		// openStore takes the store. One this session left untaken is
		// dropped with it: the next session opens its own.
		sctx, cancel := context.WithCancel(ctx)
		opening = checkpoint.StartOpen(sctx, p.cfg.Checkpoint.Topic, sink.ClientOpts(p.cfg.Kafka, p.log.Named("kafka")), p.log.Named("checkpoint"))
		defer func() { cancel(); opening.Drop() }()
	}
	var connected func(wal.System) error
	if p.cfg.IsExactlyOnce() {
		connected = func(sys wal.System) error {
			tk, err := p.fence(ctx, sys, opening)
			if err != nil {
				return err
			}
			k.Close()
			k = tk
			return nil
		}
	}
	// From reading the slot to START_REPLICATION, one replica at a time
	// (postgres.StartLock): the first start's backfill included.
	lock, err := postgres.LockStart(ctx, p.cfg.Postgres, p.cfg.Postgres.Slot)
	if err != nil {
		return err
	}
	defer lock.Release(ctx)
	st, err := p.start(ctx, opening, connected)
	if err != nil {
		return err
	}
	streaming := false
	d := p.sessionDeps()
	d.Store, d.Progress, d.Retention = p.store, p.progress, p.cleaner()
	if p.cfg.Replay.Window > 0 {
		d.Window = p.window()
	}
	d.Streaming = func(beat func() time.Time, tr *delivery.Tracker) {
		streaming = true
		// The walsender holds the slot now: that is the lock from here on.
		lock.Release(ctx)
		p.health.Streaming(beat)
		p.setState(true, fmt.Sprintf("streaming replication slot %q", p.cfg.Postgres.Slot))
		p.streamed.Store(true)
		if p.opts.OnSession != nil {
			p.opts.OnSession(tr)
		}
	}
	end, err := session.Run(ctx, d, k, st)
	if streaming {
		p.health.Streaming(nil)
		p.setState(false, "session ended")
		p.confirmed.Store(uint64(end.Confirmed))
	}
	if end.Carry != nil {
		p.carry = end.Carry
	}
	return err
}

// sessionDeps is what every session needs of the pipeline; a session
// that streams the slot needs also its checkpoint, the replay window and
// retention (runSession).
func (p *Pipeline) sessionDeps() session.Deps {
	return session.Deps{
		Config: p.cfg, Log: p.log, Metrics: p.m, Router: p.router, Schemas: p.schemas,
		Jobs: p.bf, Backfill: *p.backfills(), Requests: &p.requests, Refused: &p.refused, Tables: p.tableDeps(),
		IgnoredMessages: &p.IgnoredMessages, DeadLettered: &p.DeadLettered, Walsender: &p.walsender,
		Busy: p.health.Busy, OnDelivered: p.opts.OnDelivered, OnBackfillChunk: p.opts.OnBackfillChunk,
	}
}

// backfills is the runner for this pipeline's config.
func (p *Pipeline) backfills() *backfill.Runner {
	return &backfill.Runner{
		Postgres: p.cfg.Postgres, StatementTimeout: p.cfg.Backfill.StatementTimeout, ReaderRole: p.cfg.Backfill.ReaderRole, SendUnknownOrder: p.cfg.Backfill.OnUnknownOrder == config.OnUnknownOrderSend, KeyOf: p.router.Key, Tables: p.cfg.Tables,
		MaxInFlight: p.cfg.MaxInFlight, MaxInFlightBytes: p.cfg.MaxInFlightBytes, ChunkBytes: backfill.ChunkBytes(p.cfg.MaxInFlightBytes),
		StatusInterval: p.cfg.Postgres.StatusInterval,
		Backoff:        p.cfg.RetryBackoff, BackoffMax: p.cfg.RetryBackoffMax,
		Log: p.log, Metrics: p.m,
	}
}

// tableDeps is what the tables' watch needs of the pipeline.
func (p *Pipeline) tableDeps() tablewatch.Deps {
	return tablewatch.Deps{
		Postgres: p.cfg.Postgres, Tables: p.cfg.Tables, WALTables: p.cfg.WALTables(),
		ConfigFile: p.configFile(), Metrics: p.m, OpenSnapshot: p.backfills().OpenSnapshot,
		NewSnapshot: p.backfills().NewSnapshot, Log: p.log,
	}
}

// cleaner is the tables' retention (internal/retention) for a session that
// streams, nil when no table has one (retention.New).
func (p *Pipeline) cleaner() *retention.Cleaner {
	return retention.New(retention.Cleaner{Postgres: p.cfg.Postgres, Tables: p.cfg.Tables, Saved: p.progress.Saved, Pending: p.bf.Pending,
		SetMarks: p.progress.SetRetentionMarks, Now: p.opts.Clock, Interval: p.opts.RetentionInterval, Log: p.log.Named("retention"), Metrics: p.m})
}
