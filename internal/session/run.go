package session

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pglogrepl"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/backfill"
	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/config"
	"github.com/outboxcdc/cdc/internal/delivery"
	"github.com/outboxcdc/cdc/internal/errtext"
	"github.com/outboxcdc/cdc/internal/leaf"
	"github.com/outboxcdc/cdc/internal/metrics"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/park"
	"github.com/outboxcdc/cdc/internal/relay"
	"github.com/outboxcdc/cdc/internal/replay"
	"github.com/outboxcdc/cdc/internal/request"
	"github.com/outboxcdc/cdc/internal/retention"
	"github.com/outboxcdc/cdc/internal/route"
	"github.com/outboxcdc/cdc/internal/schema"
	"github.com/outboxcdc/cdc/internal/setup"
	"github.com/outboxcdc/cdc/internal/signing"
	"github.com/outboxcdc/cdc/internal/sink"
	"github.com/outboxcdc/cdc/internal/tablewatch"
	"github.com/outboxcdc/cdc/internal/wal"
)

// Deps is what a session needs of the pipeline that runs it: the config,
// what lives across sessions (the checkpoint, the backfill jobs, the
// requests' way in, the counters), and the hooks. The pipeline makes one
// for each session; a session changes none of its fields.
type Deps struct {
	Config  config.Config // validated
	Log     hclog.Logger
	Metrics *metrics.Metrics
	Router  *route.Router
	Schemas *schema.Registry // nil unless a table's schema is in the registry
	// Store is the checkpoint store; Progress, the pipeline's progress
	// from the checkpoint this session's start read. Both nil in a replay.
	Store    *checkpoint.Store
	Progress *delivery.Progress
	// Jobs is the backfill jobs as the stream has reached them, across
	// sessions; Backfill, the runner for the config (the session sets its
	// Room for the jobs it runs beside the stream).
	Jobs     *backfill.Jobs
	Backfill backfill.Runner
	// Requests is the one way in for the operator's requests the stream
	// meets (package request): what it refused, and its budget of
	// look-ups, across sessions.
	Requests *request.Gate
	// Refused are the topics the brokers refused an event's record for,
	// across sessions (relay.RefusedTopics).
	Refused *relay.RefusedTopics
	// Tables is what the tables' watch needs (tablewatch.Deps).
	Tables tablewatch.Deps
	// Window keeps the replay window beside the stream; nil without one.
	// Retention is the tables' retention; nil when no table has one
	// (retention.New).
	Window    *replay.Window
	Retention *retention.Cleaner
	// IgnoredMessages counts the logical decoding messages that were not
	// events, DeadLettered the events sent to a dead-letter topic.
	IgnoredMessages, DeadLettered *atomic.Int64
	// Walsender is set to the server process of the replication
	// connection as it starts streaming, for the pipeline to tell this
	// instance's slot hold from another's.
	Walsender *atomic.Uint32
	// Busy notes progress that is not the stream's: a first start's
	// backfill works, busy and not stuck (endpoint.Health.Busy).
	Busy func()
	// Streaming, if set, is called once the stream has started, before
	// its first receive, with the stream's heartbeat (wal.Stream.Beat)
	// and the session's tracker: the walsender holds the slot from then
	// on. It must not block.
	Streaming func(beat func() time.Time, tr *delivery.Tracker)
	// OnDelivered and OnBackfillChunk are pipeline.Options'.
	OnDelivered     func(rec *kgo.Record, err error)
	OnBackfillChunk func(low, high pglogrepl.LSN, read, sent int)
}

// Start is where a session starts: what the pipeline's start opened,
// under the slot's start lock, against the checkpoint.
type Start struct {
	Conn    *wal.Conn     // the replication connection
	From    pglogrepl.LSN // where the session streams from
	Catalog setup.Catalog // the outbox tables as the catalog has them
	// Snapshot is a first start's exported snapshot of the slot's
	// consistent point, for its backfill ("" otherwise). It lives as
	// long as Conn runs no other command.
	Snapshot string
}

// End is what a session that streamed leaves to the next.
type End struct {
	// Confirmed is the last position the stream confirmed, in its last
	// status update.
	Confirmed pglogrepl.LSN
	// Carry is what Kafka acknowledged past the last checkpoint when
	// Postgres ended the session while Kafka answered; nil otherwise.
	// The next session that resumes checkpoints it first.
	Carry *delivery.Position
}

// Run makes the session of st, on k, streams until ctx is done or the
// session ends, and ends it: it opens (open), streams with its background
// tasks beside the stream (besides), and ends (finish). It closes
// st.Conn; k, which exactly-once mode makes transactional, is the
// caller's to close. The stream outlives ctx by as much as it takes to
// reach the end of a transaction. It returns the session's error: nil on
// a shutdown.
func Run(ctx context.Context, d Deps, k *sink.Kafka, st Start) (End, error) {
	s, closeSession, err := open(ctx, d, k, st)
	if err != nil {
		if ctx.Err() != nil {
			return End{}, nil
		}
		return End{}, err
	}
	defer closeSession()
	if d.Streaming != nil {
		d.Streaming(s.stream.Beat, s.tracker)
	}
	acks, batch := s.acks()
	watchErr, stop := s.besides(ctx)
	defer stop()
	// A shutdown ends the stream through session.end.
	runErr := s.stream.Run(context.WithoutCancel(ctx), s.handle, acks, batch)
	return s.finish(ctx, acks, runErr, watchErr)
}

// open makes the session of what start opened: its tracker, decoder and
// table watch, a first start's backfill (in the snapshot of the slot's
// consistent point) or what the configuration's backfills left (in a
// snapshot of now), the follower of backfill requests, and the stream,
// started. It closes st.Conn when it fails; close releases what it
// opened, once the stream is closed.
func open(ctx context.Context, d Deps, k *sink.Kafka, st Start) (s *session, close func(), err error) {
	saved := d.Progress.Saved()
	cfg := d.Config
	if len(saved.Parked) > 0 && len(cfg.Checkpoint.SigningKeys) == 0 {
		// Without the key a parked key's later records would be sealed
		// with none, and taken for forged (then missing) once it is back.
		return nil, nil, errtext.Fatalf("the checkpoint lists %d parked keys (the first %.64q), whose records are sealed with checkpoint.signing_key_file's key, and none is set: put the key file back (cdc parked lists them; cdc redrive sends them on), then start again",
			len(saved.Parked), saved.Parked[0].Key)
	}
	s = &session{
		d:       d,
		kafka:   k,
		tracker: newTracker(cfg, st.From),
		ctx:     ctx,
		skipTo:  saved.CommitLSN,
		tables:  tablewatch.New(d.Tables, saved, st.Catalog),
		parked:  park.New(saved.Parked, cfg.MaxParkedKeys, int(cfg.Kafka.MaxMessageBytesOf(cfg.Checkpoint.Topic))/2),
		ledger:  request.Ledger{Used: saved.Used, Also: d.Jobs.Has, MaxBytes: int(cfg.Kafka.MaxMessageBytesOf(cfg.Checkpoint.Topic)) / 8},
	}
	d.Metrics.ParkedKeys.Set(float64(s.parked.Len()))
	// A parking keeps its topic when a table's parked_topic (or on_invalid)
	// changes: the key's later records still join it there, as large as
	// today's parked topics take them, before the session produces any.
	var holding []string
	for _, p := range saved.Parked {
		holding = append(holding, p.Topic)
	}
	k.HoldParked(holding)
	if keys := cfg.Checkpoint.SigningKeys; len(keys) > 0 {
		s.parked.SealWith(signing.ID(keys[0]))
		for _, p := range saved.Parked {
			if gone := park.Unsealable(&p, keys); len(gone) > 0 {
				d.Log.Warn("a parked key's records are sealed with a signing key checkpoint.signing_key_file no longer has: no redrive can send them until that key is back in the file, on a line after the first",
					"key", p.Key, "episode", p.Episode, "key_ids", strings.Join(gone, ","))
			}
		}
	}
	s.covered = s.tables.Covered()
	pt := &leaf.Finder{Postgres: cfg.Postgres, Tables: cfg.Tables}
	s.dec = s.newDecoder(pt, s.tables)
	if s.skipTo >= st.From {
		d.Log.Info("the slot is behind the checkpoint (Postgres restarted or crashed before its position reached disk); skipping the transactions Kafka already holds",
			"slot_lsn", st.From.String(), "through_commit_lsn", s.skipTo.String())
	}
	if cfg.IsExactlyOnce() {
		eos := cfg.ExactlyOnce
		s.eos = delivery.NewCommitter(k, s.tracker, d.Progress, d.Store, func() bool { return s.tx != nil },
			eos.CommitEvents, eos.CommitInterval, cfg.Postgres.StatusInterval)
	}
	s.out = s.newSender()
	fail := func(err error) (*session, func(), error) {
		st.Conn.Close(context.WithoutCancel(ctx))
		if s.requests != nil {
			s.requests.Close()
		}
		pt.Close(ctx)
		return nil, nil, err
	}
	if err := s.beforeStream(ctx, st, saved.Backfills); err != nil {
		return fail(err)
	}
	d.Walsender.Store(st.Conn.PID())
	if s.stream, err = st.Conn.Start(ctx, cfg.Postgres.Slot, st.From); err != nil {
		return fail(err)
	}
	return s, func() { s.requests.Close(); pt.Close(ctx) }, nil
}

// beforeStream is what a session does under the start lock before the
// stream: the first start's backfill, the redrives asked while the
// connector was stopped, and what the configuration's backfill left.
func (s *session) beforeStream(ctx context.Context, st Start, jobs []checkpoint.Job) (err error) {
	d := s.d
	if st.Snapshot != "" {
		// Before anything else on the replication connection, which would end
		// the snapshot's export (docs/design.md, "Backfill consistency").
		if err := d.Backfill.FirstStart(ctx, s, jobs, st.Snapshot, st.From); err != nil {
			return err
		}
	}
	saved := d.Progress.Saved()
	if s.requests, err = request.Follow(d.Store, saved.Key()); err != nil {
		return err
	}
	// Under the start lock, before the stream: no other replica runs them.
	// Before what the configuration's backfill left, too: a key it parked
	// holds its older rows, and a redrive asked while the connector was
	// stopped (at max_parked_keys, say) is how it starts again.
	if err := s.pendingRedrives(ctx); err != nil {
		return err
	}
	if st.Snapshot == "" {
		// What the configuration's backfills left goes before the stream,
		// so that an aggregate's older rows come before its newer events.
		return d.Backfill.Continue(ctx, s, jobs, st.From)
	}
	return nil
}

// newTracker is a session's tracker, with the in-flight limits.
func newTracker(cfg config.Config, from pglogrepl.LSN) *delivery.Tracker {
	tr := delivery.NewTracker(from, cfg.MaxInFlight)
	tr.LimitBytes(cfg.MaxInFlightBytes)
	return tr
}

// acks is how the session confirms: at least once, a Confirmer, with the
// producer's batching for the stream to drive; exactly once, the session's
// Committer. A checkpoint's ack is what lets the position move: it wakes
// the stream to confirm it now, not at the loop's next poll.
func (s *session) acks() (sessionAcks, wal.Releaser) {
	saved := func() { s.d.Metrics.Checkpoints.Inc(); s.stream.Wake() }
	if s.eos != nil {
		s.eos.OnSaved(saved)
		return s.eos, nil
	}
	pg := s.d.Config.Postgres
	c := delivery.NewConfirmer(s.tracker, s.d.Progress, s.d.Store, s.kafka.Produce, pg.ConfirmInterval, pg.StatusInterval)
	c.OnSaved(saved)
	return c, s.kafka
}

// besides starts the session's background tasks beside the stream: the
// Kafka watch, the replay window, the tables' watch, retention (on the
// holder of the slot only) and the backfills. A shutdown (ctx done), and
// what must stop the connector, found by the tables' watch (watchErr),
// end the stream between two transactions (session.end), so that what
// Kafka acknowledged is checkpointed and confirmed first and a restart
// sends nothing twice. stop ends the tasks, the last started first.
func (s *session) besides(ctx context.Context) (watchErr func() error, stop func()) {
	d := s.d
	var stops []func()
	stop = func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	// The watch reports the session until it ends, shutdown included.
	stops = append(stops, background(context.WithoutCancel(ctx), func(wctx context.Context) {
		delivery.WatchAcks(s.tracker, d.Metrics, d.Log, strings.Join(d.Config.Kafka.Brokers, ","), wctx.Done())
	}))
	if d.Window != nil {
		stops = append(stops, background(ctx, d.Window.Keep))
	}
	shutdown := context.AfterFunc(ctx, s.end)
	stops = append(stops, func() { shutdown() })
	var werr atomic.Pointer[error]
	stops = append(stops, background(ctx, func(tctx context.Context) {
		s.tables.Run(tctx, func(err error) { werr.Store(&err); s.end() })
	}))
	if d.Retention != nil {
		stops = append(stops, background(ctx, d.Retention.Run))
	}
	// Backfills run from the saved checkpoint's state.
	d.Jobs.Reset(d.Progress.Saved().Backfills)
	runner := d.Backfill
	runner.Room = s.room
	stops = append(stops, background(ctx, func(bctx context.Context) { runner.Run(bctx, d.Jobs) }))
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

// finish ends a session whose stream returned runErr. On a shutdown, or
// a stop the tables' watch asked for, it lets Kafka answer what is in
// flight, writes the last checkpoint and confirms what it covers; when
// Postgres ended the session while Kafka answers, it carries what Kafka
// acknowledged to the next session (End.Carry). It returns the session's
// error: nil on a shutdown.
func (s *session) finish(ctx context.Context, acks sessionAcks, runErr error, watchErr func() error) (End, error) {
	var end End
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
	// Stopping on an event (on_invalid: fail, max_parked_keys reached),
	// what Kafka acknowledged before it is checkpointed first: cdc parked
	// then lists every key parked before it, for the operator to redrive.
	stopping = stopping || (errors.As(runErr, new(*outbox.EventError)) && acks.Err() == nil)
	if !stopping && s.eos == nil && acks.Err() == nil {
		// Postgres ended the session (a restart, a crash, a network cut) while
		// Kafka answers: let it acknowledge what is in flight, and carry the
		// position to the next session, which checkpoints it before it streams
		// (position). The slot's own position goes back after a Postgres
		// restart (docs/design.md, "Re-delivery after a crash"): what the
		// checkpoint covers is skipped, not sent again.
		fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_ = s.kafka.Flush(fctx)
		cancel()
		if pos := s.tracker.Position(); pos.CommitLSN > s.d.Progress.Saved().CommitLSN {
			end.Carry = &pos
		}
	}
	if stopping {
		// Shutdown: stop reading (done, at a transaction's end), let Kafka
		// answer what is in flight, write the checkpoint, then confirm what
		// it covers, all within shutdown_timeout of the request.
		timeout := s.d.Config.ShutdownTimeout
		fctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), s.endAsked().Add(timeout))
		if err := s.kafka.Flush(fctx); err != nil {
			s.d.Log.Warn("shutdown deadline passed before kafka acked every event; they will be sent again on the next start",
				"in_flight", s.tracker.InFlight(), "timeout", timeout)
		}
		if err := acks.Final(fctx); err != nil {
			s.d.Log.Warn("last checkpoint not written; what it would have covered is sent again on the next start", "error", errtext.OneLine(err))
		}
		cancel()
	}
	end.Confirmed = s.stream.Close(context.WithoutCancel(ctx), acks)
	if ctx.Err() != nil {
		return end, nil
	}
	return end, runErr
}
