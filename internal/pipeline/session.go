package pipeline

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/decode"
	"github.com/outboxcdc/cdc/internal/delivery"
	"github.com/outboxcdc/cdc/internal/errtext"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/park"
	"github.com/outboxcdc/cdc/internal/postgres"
	"github.com/outboxcdc/cdc/internal/relay"
	"github.com/outboxcdc/cdc/internal/replay"
	"github.com/outboxcdc/cdc/internal/retention"
	"github.com/outboxcdc/cdc/internal/sink"
	"github.com/outboxcdc/cdc/internal/tablewatch"
	"github.com/outboxcdc/cdc/internal/wal"
)

// runSession sets up, runs and shuts down one replication session: it
// opens (openSession), streams with its background tasks beside the
// stream (besides), and ends (endSession).
func (p *Pipeline) runSession(ctx context.Context) error {
	k, err := sink.Connect(ctx, p.cfg.Producer(), p.log.Named("kafka"), p.kafkaOpts()...)
	if err != nil {
		return err
	}
	p.log.Debug("kafka: brokers answered")
	if !p.parkedChecked {
		p.parkedChecked = true
		relay.WarnTimedParked(ctx, k, p.cfg.Tables, p.log)
	}
	defer func() { k.Close() }() // the transactional producer replaces it
	var opening *checkpoint.Opening
	if p.store == nil {
		// The checkpoint topic's round trips overlap with Postgres's;
		// openStore takes the store. One this session left untaken is
		// dropped with it: the next session opens its own.
		sctx, cancel := context.WithCancel(ctx)
		defer cancel()
		opening = checkpoint.StartOpen(sctx, p.cfg.Checkpoint.Topic, sink.ClientOpts(p.cfg.Kafka, p.log.Named("kafka")), p.log.Named("checkpoint"))
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
	o, err := p.start(ctx, opening, connected)
	if err != nil {
		return err
	}
	s, closeSession, err := p.openSession(ctx, k, o)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	defer closeSession()
	// The walsender holds the slot now: that is the lock from here on.
	lock.Release(ctx)

	p.health.Streaming(s.stream.Beat)
	p.setState(true, fmt.Sprintf("streaming replication slot %q", p.cfg.Postgres.Slot))
	p.streamed.Store(true)
	defer func() {
		p.health.Streaming(nil)
		p.setState(false, "session ended")
	}()
	acks, batch := p.acks(s, k)
	if p.opts.OnSession != nil {
		p.opts.OnSession(s.tracker)
	}
	watchErr, stop := p.besides(ctx, s)
	defer stop()
	// The stream outlives ctx by as much as it takes to reach the end of a
	// transaction: a shutdown ends it through session.end.
	runErr := s.stream.Run(context.WithoutCancel(ctx), s.handle, acks, batch)
	return p.endSession(ctx, s, k, acks, runErr, watchErr)
}

// openSession makes the session of what start opened: its tracker,
// decoder and table watch, a first start's backfill (in the snapshot of
// the slot's consistent point), the follower of backfill requests, and
// the stream, started. It closes o.conn when it fails; close releases what
// it opened, once the stream is closed.
func (p *Pipeline) openSession(ctx context.Context, k *sink.Kafka, o opened) (s *session, close func(), err error) {
	saved := p.progress.Saved()
	s = &session{
		p:       p,
		kafka:   k,
		tracker: p.newTracker(o.from),
		ctx:     ctx,
		skipTo:  saved.CommitLSN,
		tables:  tablewatch.New(p.tableDeps(), saved, o.cat),
		parked:  park.New(saved.Parked, p.cfg.MaxParkedKeys, int(p.cfg.Kafka.MaxMessageBytesOf(p.cfg.Checkpoint.Topic))/2),
	}
	p.m.ParkedKeys.Set(float64(s.parked.Len()))
	pt := &tablewatch.Partitions{Postgres: p.cfg.Postgres, Tables: p.cfg.Tables}
	s.dec = s.newDecoder(pt, s.tables)
	if s.skipTo >= o.from {
		p.log.Info("the slot is behind the checkpoint (Postgres restarted or crashed before its position reached disk); skipping the transactions Kafka already holds",
			"slot_lsn", o.from.String(), "through_commit_lsn", s.skipTo.String())
	}
	if p.cfg.IsExactlyOnce() {
		eos := p.cfg.ExactlyOnce
		s.eos = delivery.NewCommitter(k, s.tracker, p.progress, p.store, func() bool { return s.tx != nil },
			eos.CommitEvents, eos.CommitInterval, p.cfg.Postgres.StatusInterval)
	}
	s.out = s.newSender()
	fail := func(err error) (*session, func(), error) {
		o.conn.Close(context.WithoutCancel(ctx))
		if s.requests != nil {
			s.requests.Close()
		}
		pt.Close(ctx)
		return nil, nil, err
	}
	if o.snapshot != "" {
		// Before anything else on the replication connection, which would end
		// the snapshot's export (docs/design.md, "Backfill consistency").
		if err := p.backfills().FirstStart(ctx, s, saved.Backfills, o.snapshot, o.from); err != nil {
			return fail(err)
		}
	}
	saved = p.progress.Saved()
	if s.requests, err = p.store.FollowRequests(saved.Key()); err != nil {
		return fail(err)
	}
	p.walsender.Store(o.conn.PID())
	if s.stream, err = o.conn.Start(ctx, p.cfg.Postgres.Slot, o.from); err != nil {
		return fail(err)
	}
	return s, func() { s.requests.Close(); pt.Close(ctx) }, nil
}

// acks is how the session confirms: at least once, a Confirmer, with the
// producer's batching for the stream to drive; exactly once, the session's
// Committer. A checkpoint's ack is what lets the position move: it wakes
// the stream to confirm it now, not at the loop's next poll.
func (p *Pipeline) acks(s *session, k *sink.Kafka) (sessionAcks, wal.Releaser) {
	saved := func() { p.m.Checkpoints.Inc(); s.stream.Wake() }
	if s.eos != nil {
		s.eos.OnSaved(saved)
		return s.eos, nil
	}
	c := delivery.NewConfirmer(s.tracker, p.progress, p.store, k.Produce, p.cfg.Postgres.ConfirmInterval, p.cfg.Postgres.StatusInterval)
	c.OnSaved(saved)
	return c, k
}

// besides starts the session's background tasks beside the stream: the
// Kafka watch, the replay window, the tables' watch, retention (on the
// holder of the slot only) and the backfills. A shutdown (ctx done), and
// what must stop the connector, found by the tables' watch (watchErr),
// end the stream between two transactions (session.end), so that what
// Kafka acknowledged is checkpointed and confirmed first and a restart
// sends nothing twice. stop ends the tasks, the last started first.
func (p *Pipeline) besides(ctx context.Context, s *session) (watchErr func() error, stop func()) {
	var stops []func()
	stop = func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	// The watch reports the session until it ends, shutdown included.
	stops = append(stops, background(context.WithoutCancel(ctx), func(wctx context.Context) {
		delivery.WatchAcks(s.tracker, p.m, p.log, strings.Join(p.cfg.Kafka.Brokers, ","), wctx.Done())
	}))
	if p.cfg.Replay.Window > 0 {
		stops = append(stops, background(ctx, p.window().Keep))
	}
	shutdown := context.AfterFunc(ctx, s.end)
	stops = append(stops, func() { shutdown() })
	var werr atomic.Pointer[error]
	stops = append(stops, background(ctx, func(tctx context.Context) {
		s.tables.Run(tctx, func(err error) { werr.Store(&err); s.end() })
	}))
	if cl := p.cleaner(); cl != nil {
		stops = append(stops, background(ctx, cl.Run))
	}
	// Backfills run from the saved checkpoint's state.
	p.bf.Reset(p.progress.Saved().Backfills)
	runner := p.backfills()
	runner.Room = s.room
	stops = append(stops, background(ctx, func(bctx context.Context) { runner.Run(bctx, p.bf) }))
	watchErr = func() error {
		if e := werr.Load(); e != nil {
			return *e
		}
		return nil
	}
	return watchErr, stop
}

// background runs task on a goroutine of its own, with a context of its
// own; stop cancels that context and waits for task to return.
func background(ctx context.Context, task func(context.Context)) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); task(ctx) }()
	return func() { cancel(); <-done }
}

// endSession ends a session whose stream returned runErr. On a shutdown,
// or a stop the tables' watch asked for, it lets Kafka answer what is in
// flight, writes the last checkpoint and confirms what it covers; when
// Postgres ended the session while Kafka answers, it carries what Kafka
// acknowledged to the next session (p.carry). It returns the session's
// error: nil on a shutdown.
func (p *Pipeline) endSession(ctx context.Context, s *session, k *sink.Kafka, acks sessionAcks, runErr error, watchErr func() error) error {
	if s.eos != nil {
		s.eos.Halt()
	}
	stopping := ctx.Err() != nil
	if errors.Is(runErr, wal.ErrEnded) {
		runErr = nil
	}
	if werr := watchErr(); werr != nil && ctx.Err() == nil {
		runErr, stopping = werr, true
	}
	if !stopping && s.eos == nil && acks.Err() == nil {
		// Postgres ended the session (a restart, a crash, a network cut) while
		// Kafka answers: let it acknowledge what is in flight, and carry the
		// position to the next session, which checkpoints it before it streams
		// (position). The slot's own position goes back after a Postgres
		// restart (docs/design.md, "Re-delivery after a crash"): what the
		// checkpoint covers is skipped, not sent again.
		fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_ = k.Flush(fctx)
		cancel()
		if pos := s.tracker.Position(); pos.CommitLSN > p.progress.Saved().CommitLSN {
			p.carry = &pos
		}
	}
	if stopping {
		// Shutdown: stop reading (done, at a transaction's end), let Kafka
		// answer what is in flight, write the checkpoint, then confirm what
		// it covers, all within shutdown_timeout of the request.
		fctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), s.endAsked().Add(p.cfg.ShutdownTimeout))
		if err := k.Flush(fctx); err != nil {
			p.log.Warn("shutdown deadline passed before kafka acked every event; they will be sent again on the next start",
				"in_flight", s.tracker.InFlight(), "timeout", p.cfg.ShutdownTimeout)
		}
		if err := acks.Final(fctx); err != nil {
			p.log.Warn("last checkpoint not written; what it would have covered is sent again on the next start", "error", errtext.OneLine(err))
		}
		cancel()
	}
	final := s.stream.Close(context.WithoutCancel(ctx), acks)
	p.confirmed.Store(uint64(final))
	if ctx.Err() != nil {
		return nil
	}
	return runErr
}

// cleaner is the tables' retention (internal/retention) for a session that
// streams, nil when no table has one (retention.New).
func (p *Pipeline) cleaner() *retention.Cleaner {
	return retention.New(retention.Cleaner{Postgres: p.cfg.Postgres, Tables: p.cfg.Tables, Saved: p.progress.Saved, Pending: p.bf.Pending,
		SetMarks: p.progress.SetRetentionMarks, Now: p.opts.Clock, Interval: p.opts.RetentionInterval, Log: p.log.Named("retention"), Metrics: p.m})
}

// sessionAcks is how a session confirms: what the replication loop reads
// (wal.Acks), and what shutdown finishes. Its two implementations live side
// by side in internal/delivery: the Confirmer at least once, the Committer
// exactly once.
type sessionAcks interface {
	wal.Acks
	Final(ctx context.Context) error
}

// session is one replication session: one replication connection, one
// Kafka client, one decoder and one tracker. One event goes as
// docs/design.md draws it: the stream hands its bytes to handle, the
// decoder turns them into an Event, event hands it to the relay.Sender,
// which has the router make a Record (or a dead-letter record) and
// produces it, and its ack lands in the tracker, which the stream reads
// before its next receive. Everything but the ack callback runs on the
// stream's goroutine.
type session struct {
	p       *Pipeline
	kafka   *sink.Kafka
	tracker *delivery.Tracker
	dec     *decode.Decoder
	tx      *delivery.Txn // the open transaction, between BEGIN and COMMIT
	// replay, when set, selects what a replay re-sends; nil streams all.
	replay *replay.Filter
	// ctx is the session's, for the admin calls EnsureTopic makes.
	ctx context.Context
	// out sends the events on to Kafka.
	out *relay.Sender
	// eos commits Kafka transactions in exactly-once mode (nil otherwise).
	eos *delivery.Committer
	// stream is the replication stream once it started, for blocking.
	stream *wal.Stream
	// requests follows the backfill requests in the checkpoint topic.
	requests *checkpoint.Requests
	// tables watches the outbox tables' lives (package tablewatch); nil in a
	// replay.
	tables *tablewatch.Watch
	// parked holds back the keys on_invalid: park parked (package park),
	// from the saved checkpoint's; nil in a replay.
	parked *park.Set
	// skipTo is the commit LSN of the last transaction the checkpoint says
	// Kafka holds, in this WAL history (wal.Conn.SameHistory); skipping is set between
	// the BEGIN and COMMIT of a transaction at or below it. A slot's confirmed
	// position reaches disk only at a server checkpoint, so after a Postgres
	// restart or crash it goes back (docs/design.md, "Re-delivery after a
	// crash"), and without the skip everything since was sent again, in either
	// mode.
	skipTo   pglogrepl.LSN
	skipping bool
	// endedAt is when end was first called (unix nanoseconds), or 0.
	endedAt atomic.Int64
}

// end asks the stream to end between two transactions, within half of
// shutdown_timeout (wal.Stream.End): what it sent is then whole
// transactions, which the last checkpoint covers, and a restart sends
// none of it again. Shutdown and the tables' watch call it, on any
// goroutine.
func (s *session) end() {
	s.endedAt.CompareAndSwap(0, time.Now().UnixNano())
	s.stream.End(s.p.cfg.ShutdownTimeout / 2)
}

// endAsked is when end was first called, or now if it was not: a
// shutdown's deadlines run from it.
func (s *session) endAsked() time.Time {
	if at := s.endedAt.Load(); at != 0 {
		return time.Unix(0, at)
	}
	return time.Now()
}

// blocking runs fn, which may block for seconds, keeping the slot's lease
// through the stream (wal.Stream.While) once the session streams.
func (s *session) blocking(fn func() error) error {
	if s.stream == nil {
		return fn() // the first start's backfill: no stream yet
	}
	return s.stream.While(fn)
}

// handle takes one pgoutput message from the stream.
func (s *session) handle(_ pglogrepl.LSN, data []byte) error {
	m, err := s.dec.Decode(data)
	if err != nil {
		if errors.As(err, new(*decode.LookupError)) {
			return err // the catalog did not answer: a new session asks again
		}
		return &decodeError{err}
	}
	switch m.Kind {
	case decode.KindBegin:
		if m.Commit <= s.skipTo {
			s.skipping = true
			return nil
		}
		if s.eos != nil {
			if err := s.eos.Begin(); err != nil {
				return err
			}
		}
		if s.replay != nil {
			if err := s.replay.Begin(&m); err != nil {
				return err
			}
		}
		s.tx = s.tracker.Begin(m.CommitTime)
	case decode.KindEvent, decode.KindInvalid:
		if m.Fresh && s.tables != nil {
			// Before the skip: a row Kafka holds is not a repair's either.
			s.tables.NoteFresh(&m.Event)
		}
		if s.skipping {
			return nil
		}
		if s.replay != nil && !s.replay.Take(&m.Event) {
			return nil
		}
		s.p.bf.Seen(&m.Event)
		return s.event(&m)
	case decode.KindIgnoredMessage:
		s.p.IgnoredMessages.Add(1)
	case decode.KindUnmapped:
		if s.tables != nil {
			s.tables.UnmappedInsert(m.Relation)
		}
	case decode.KindControl:
		if s.replay == nil && !s.skipping {
			return s.control(&m)
		}
	case decode.KindCommit:
		if s.skipping {
			s.skipping = false
			return nil
		}
		s.tracker.Commit(s.tx, m.Commit, m.EndLSN, m.CommitTime)
		s.tx = nil
		if s.replay != nil {
			s.replay.Commit()
		}
	}
	return nil
}

// event sends one event on to Kafka, in the open transaction (package
// relay).
func (s *session) event(m *decode.Message) error { return s.out.Send(s.ctx, s.tx, m) }

// newSender is the session's relay.Sender, once its tracker, Kafka client,
// committer and replay filter are set.
func (s *session) newSender() *relay.Sender {
	p := s.p
	out := &relay.Sender{
		Router: p.router, Schemas: p.schemas, Kafka: s.kafka, Tracker: s.tracker,
		MaxMessageBytes: int(p.cfg.Kafka.MaxMessageBytes), DeadLetterMaxMessageBytes: int(p.cfg.Kafka.DeadLetterMaxMessageBytes),
		CheckpointTopic: p.cfg.Checkpoint.Topic, Blocking: s.blocking, Skipped: s.skipped,
		Parked: s.parked, MaxParkedKeys: p.cfg.MaxParkedKeys,
		OnDelivered: p.opts.OnDelivered, DeadLettered: &p.DeadLettered, Metrics: p.m, Log: p.log,
	}
	if s.eos != nil {
		out.Produced = s.eos.Produced
	}
	if s.replay != nil {
		out.Suffix, out.LeftOut = s.replay.Suffix(), s.replay.LeftOut
	}
	return out
}

// skipped reports whether an operator chose, with cdc skip, to send ev to
// the dead-letter topic rather than stop on it.
func (s *session) skipped(ev *outbox.Event) bool {
	if s.p.progress == nil || s.replay != nil {
		return false
	}
	saved := s.p.progress.Saved()
	return saved.Skipped(ev.CommitLSN, ev.ID())
}
