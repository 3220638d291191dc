package pipeline

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pglogrepl"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/backfill"
	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/config"
	"github.com/outboxcdc/cdc/internal/delivery"
	"github.com/outboxcdc/cdc/internal/endpoint"
	"github.com/outboxcdc/cdc/internal/errtext"
	"github.com/outboxcdc/cdc/internal/fault"
	"github.com/outboxcdc/cdc/internal/metrics"
	"github.com/outboxcdc/cdc/internal/ops"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/postgres"
	"github.com/outboxcdc/cdc/internal/relay"
	"github.com/outboxcdc/cdc/internal/request"
	"github.com/outboxcdc/cdc/internal/retry"
	"github.com/outboxcdc/cdc/internal/route"
	"github.com/outboxcdc/cdc/internal/schema"
	"github.com/outboxcdc/cdc/internal/setup"
)

// Options are hooks for tests and the demo; the zero value is what cdc run
// uses.
type Options struct {
	// KafkaOpts are extra franz-go options, appended last.
	KafkaOpts []kgo.Opt
	// OnSession, if set, is called with each session's tracker once the
	// session streams, so that tests and the demo can watch positions. It
	// must not block.
	OnSession func(*delivery.Tracker)
	// OnDelivered, if set, is called with each record and Kafka's answer,
	// after the tracker has counted it. On success the record's partition
	// and offset are set. It runs on franz-go's promise goroutine and must
	// not block.
	OnDelivered func(rec *kgo.Record, err error)
	// OnBackfillChunk, if set, is called on the stream's goroutine as a
	// backfill chunk is sent at its high watermark: the watermarks'
	// commit LSNs, the rows read and the rows sent (those the stream had
	// not met between the watermarks). Tests use it.
	OnBackfillChunk func(low, high pglogrepl.LSN, read, sent int)
	// ConfigFile is the config's path, for the commands error messages
	// tell the operator to run.
	ConfigFile string
	// Version is the connector's version, recorded in checkpoints.
	Version string
	// Metrics receives the pipeline's metrics; nil: a registry of its own
	// (Pipeline.Metrics).
	Metrics *metrics.Metrics
	// Clock, if set, is the clock retention dates its marks by and
	// measures ages with (retention.Cleaner.Now); RetentionInterval, if
	// set, the time between its sweeps. Tests set them to run a
	// retention.after of a day in seconds.
	Clock             func() time.Time
	RetentionInterval time.Duration
}

// Pipeline streams outbox events from one slot to Kafka.
type Pipeline struct {
	cfg     config.Config
	opts    Options
	log     hclog.Logger
	router  *route.Router
	schemas *schema.Registry // nil unless a table's schema is in the registry
	// store is opened by the first session that reaches the checkpoint;
	// progress is set by every session's start, from the checkpoint it
	// read (another replica may have moved it).
	store    *checkpoint.Store
	progress *delivery.Progress
	// parkedChecked: the parked topics' retention was looked at.
	parkedChecked bool
	m             *metrics.Metrics
	// onStandby: the last session's server was a hot standby.
	onStandby bool
	// health is what /readyz and /healthz report: what the pipeline does,
	// and whether it streams or makes progress. Busy is not stuck.
	health endpoint.Health
	// streamed: a session of this process has streamed, so a refused
	// connection since is retried (a bounded number of times).
	streamed atomic.Bool
	// waitingLogged: the standby has said it waits; it says so once.
	waitingLogged bool
	// takeover watches the slot's holder while this instance waits as a
	// standby (docs/operations.md, "Active and standby").
	takeover *postgres.Takeover
	// walsender is the server process of the last session's replication
	// connection, to tell this instance's slot hold from another's.
	walsender atomic.Uint32
	// confirmed is the last position a session confirmed as it ended, for
	// the stopped line.
	confirmed atomic.Uint64
	// bf is the backfill jobs as the stream has reached them.
	bf  *backfill.Jobs
	ops *ops.Ops // the operator commands for cfg
	// requests is the one way in for the operator's requests the
	// stream meets (package request): what it refused, and its budget of
	// look-ups, across sessions.
	requests request.Gate
	// refused are the topics the brokers refused an event's record for
	// (relay.RefusedTopics): a row's topic, never a stop of every table.
	refused relay.RefusedTopics
	// carry is what Kafka acknowledged in a session that Postgres ended,
	// past its last checkpoint: the next session that resumes checkpoints
	// it first. It is the pipeline's, not a session's: the sessions that
	// fail before they reach the checkpoint leave it for the next.
	carry *delivery.Position
	// IgnoredMessages counts logical decoding messages that were not
	// events (non-transactional, or an unknown prefix); DeadLettered counts
	// events sent to a dead-letter topic. The stopped line reports both.
	IgnoredMessages, DeadLettered atomic.Int64
}

// New validates cfg, which it then owns, and returns a Pipeline. It
// connects to nothing.
func New(cfg config.Config, log hclog.Logger, opts Options) (*Pipeline, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	r, err := route.New(cfg.Tables)
	if err != nil {
		return nil, err
	}
	p := &Pipeline{cfg: cfg, opts: opts, log: log, router: r, m: opts.Metrics}
	p.bf = backfill.NewJobs()
	if p.m == nil {
		p.m = metrics.New(p.cfg.Name)
	}
	if cfg.UsesRegistry() {
		if p.schemas, err = schema.New(cfg.Registry(), p.m, log); err != nil {
			return nil, err
		}
	}
	p.takeover = &postgres.Takeover{Postgres: cfg.Postgres, After: cfg.TakeoverAfter(), Log: log}
	p.ops = &ops.Ops{Config: p.cfg, Log: p.log, Version: opts.Version, KafkaOpts: p.kafkaOpts()}
	var sources []metrics.Source
	for _, t := range cfg.Tables {
		sources = append(sources, metrics.Source{Name: t.String(), Table: !t.IsMessage(), Topics: t.FixedTopics(), Schema: t.Schema.Registered(), Park: t.OnInvalid == outbox.OnInvalidPark})
	}
	p.m.Init(sources)
	// A streaming loop runs at least every status interval.
	p.health = endpoint.Health{UnhealthyAfter: cfg.UnhealthyAfter, LoopSilence: max(30*time.Second, 5*cfg.Postgres.StatusInterval), Gauge: p.m.Streaming}
	p.setState(false, "starting")
	p.health.Busy()
	return p, nil
}

// Ops is the operator commands (cdc check, status, rewind, reset) for
// the pipeline's config.
func (p *Pipeline) Ops() *ops.Ops { return p.ops }

// Metrics returns the pipeline's metrics.
func (p *Pipeline) Metrics() *metrics.Metrics { return p.m }

// State is what the pipeline is doing, for /readyz.
type State = endpoint.State

func (p *Pipeline) setState(streaming bool, detail string) { p.health.Set(streaming, detail, "") }

// Ready reports whether this instance holds the slot and streams, and what
// it does, for /readyz.
func (p *Pipeline) Ready() (bool, string) { return p.health.Ready() }

// Why is the error the pipeline retries after, if any, for /readyz with
// the token.
func (p *Pipeline) Why() string { return p.health.Why() }

// State returns what the pipeline is doing.
func (p *Pipeline) State() State { return p.health.State() }

// Healthy reports whether the pipeline's loops are alive
// (endpoint.Health): busy is not stuck.
func (p *Pipeline) Healthy() error { return p.health.Healthy() }

// Weaknesses lists the settings that leave a connection or a secret open
// to the network (postgres.Config.Weaknesses, sink.Config.Weaknesses): cdc run
// logs each at start, and cdc check lists them.
func (p *Pipeline) Weaknesses() []string {
	return append(append(p.cfg.Postgres.Weaknesses(), p.cfg.Kafka.Weaknesses()...), p.cfg.SchemaRegistry.Weaknesses()...)
}

// Config returns the validated configuration, defaults filled in.
func (p *Pipeline) Config() config.Config { return p.cfg }

// Run streams until ctx is done, then shuts down cleanly and returns nil;
// or until a fatal error, which it returns. Transient errors reconnect with
// backoff.
func (p *Pipeline) Run(ctx context.Context) error {
	defer p.setState(false, "stopped")
	defer func() {
		// One line on every shutdown: after a session, and also when the
		// signal came during a reconnect's backoff or before streaming.
		if ctx.Err() != nil {
			l := []any{"slot", p.cfg.Postgres.Slot}
			if c := p.confirmed.Load(); c != 0 {
				l = append(l, "confirmed_lsn", pglogrepl.LSN(c).String())
			}
			p.log.Info("stopped", append(l, "dead_lettered", p.DeadLettered.Load(), "ignored_messages", p.IgnoredMessages.Load())...)
		}
	}()
	slots, stopSlots := context.WithCancel(ctx)
	watched := make(chan struct{})
	go func() { defer close(watched); p.Ops().WatchSlots(slots, p.m) }()
	defer func() { stopSlots(); <-watched }()
	backoff := retry.New(p.cfg.RetryBackoff, p.cfg.RetryBackoffMax)
	var streak fault.Streak
	for {
		started := time.Now()
		err := p.runSession(ctx)
		if ctx.Err() != nil {
			return nil
		}
		err, fatal := streak.Classify(err, fault.Session{Streamed: p.streamed.Load(), Log: p.log, HeldByOther: func() bool {
			return setup.HeldByOther(ctx, p.cfg.Postgres, p.cfg.Postgres.Slot, p.walsender.Load())
		}})
		if fatal {
			return err
		}
		p.m.Restarts.Inc()
		if time.Since(started) > 2*p.cfg.RetryBackoffMax {
			backoff.Reset() // it ran fine for a while
		}
		if !retry.Sleep(ctx, p.retryWait(ctx, err, backoff)) {
			return nil
		}
	}
}

// retryWait says why the connector is not streaming (the log, /readyz)
// and returns how long to wait before the next session: the backoff's
// next wait, or, for a standby waiting on a slot another instance holds,
// often enough to take over within about standby.takeover_after of the
// holder going silent, and at once after ending it.
func (p *Pipeline) retryWait(ctx context.Context, err error, backoff *retry.Backoff) time.Duration {
	retryIn, wait := backoff.Current(), backoff.Next()
	var inUse *postgres.SlotInUseError
	if !errors.As(err, &inUse) {
		p.waitingLogged = false
		what := "reconnecting after an error"
		if p.progress == nil {
			what = "first start, not streaming yet; retrying after an error"
		}
		p.health.Set(false, what, errtext.OneLine(err))
		p.log.Error("session failed; reconnecting", "error", errtext.OneLine(err), "retry_in", retryIn)
		return wait
	}
	p.setState(false, fmt.Sprintf("standby: waiting for replication slot %q (%v)", p.cfg.Postgres.Slot, inUse.Err))
	p.health.Busy() // the holder is alive, or will be taken over
	// A replica starting (a first start's backfill) holds the start lock,
	// not the slot: it is looked at as often, never taken over.
	if after := p.cfg.TakeoverAfter(); after > 0 {
		wait = min(wait, after/4)
	}
	if p.cfg.TakeoverAfter() > 0 && !errors.Is(err, postgres.ErrStarting) {
		if now, ended := p.takeover.Try(ctx); now {
			wait, p.waitingLogged = 0, p.waitingLogged && !ended
		}
	}
	if wait > 0 && !p.waitingLogged {
		p.log.Warn("replication slot is in use; waiting for it as a standby", "slot", p.cfg.Postgres.Slot, "error", errtext.OneLine(err), "takeover_after", p.cfg.TakeoverAfter())
		p.waitingLogged = true
	}
	return wait
}

// kafkaOpts are the producer's extra options: the caller's, and the hook
// that counts produce requests.
func (p *Pipeline) kafkaOpts() []kgo.Opt {
	return append(append([]kgo.Opt(nil), p.opts.KafkaOpts...), kgo.WithHooks(p.m.KafkaHook()))
}
