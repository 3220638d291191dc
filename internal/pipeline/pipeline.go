package pipeline

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pglogrepl"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/decode"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/route"
	"github.com/outboxcdc/cdc/internal/sink"
	"github.com/outboxcdc/cdc/internal/wal"
)

// Config configures a pipeline.
type Config struct {
	Postgres wal.Config
	Kafka    sink.Config
	Tables   []*outbox.Table
	// DeadLetterMaxMessageBytes is the record size limit of the
	// dead-letter topics; to dead-letter oversized events it must exceed
	// Kafka.MaxMessageBytes. Default 1,000,012.
	DeadLetterMaxMessageBytes int32
	// MaxInFlight is how many events may wait for Kafka's ack before the
	// replication loop stops reading. Default 10,000.
	MaxInFlight int
	// ShutdownTimeout bounds the wait for Kafka's acks on shutdown.
	// Default 30s.
	ShutdownTimeout time.Duration
	// RetryBackoff is the first delay before reconnecting after a transient
	// error; it doubles up to RetryBackoffMax. Defaults 1s and 30s.
	RetryBackoff    time.Duration
	RetryBackoffMax time.Duration
}

// Validate fills defaults and reports the first configuration error. Each
// stage's config validates itself and owns its defaults; Validate adds the
// rules that tie stages together. New calls it: call it yourself only to
// check a config without building a pipeline.
func (c *Config) Validate() error {
	if len(c.Tables) == 0 {
		return errors.New("tables is empty; configure at least one outbox table")
	}
	c.Postgres.Messages = false
	seen := map[string]bool{}
	for _, t := range c.Tables {
		if err := t.Validate(); err != nil {
			return err
		}
		if seen[t.String()] {
			return fmt.Errorf("%s is configured twice", t)
		}
		seen[t.String()] = true
		if t.IsMessage() {
			c.Postgres.Messages = true
		}
	}
	if err := c.Postgres.Validate(); err != nil {
		return err
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = 10_000
	}
	if c.MaxInFlight < 1 {
		return fmt.Errorf("max_in_flight must be positive")
	}
	if c.Kafka.MaxBufferedRecords == 0 {
		// franz-go's Produce blocks when its buffer is full, which would
		// block the replication loop and its status updates: keep the
		// buffer above the in-flight limit.
		c.Kafka.MaxBufferedRecords = 2 * c.MaxInFlight
	}
	if err := c.Kafka.Validate(); err != nil {
		return err
	}
	if c.Kafka.MaxBufferedRecords <= c.MaxInFlight {
		return fmt.Errorf("kafka buffer (%d records) must exceed max_in_flight (%d)", c.Kafka.MaxBufferedRecords, c.MaxInFlight)
	}
	if c.DeadLetterMaxMessageBytes == 0 {
		c.DeadLetterMaxMessageBytes = sink.DefaultMaxMessageBytes
	}
	c.Kafka.TopicMaxMessageBytes = map[string]int32{}
	for _, t := range c.Tables {
		if t.OnInvalid == outbox.OnInvalidDeadLetter {
			c.Kafka.TopicMaxMessageBytes[t.DeadLetterTopic] = c.DeadLetterMaxMessageBytes
		}
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = 30 * time.Second
	}
	if c.RetryBackoff == 0 {
		c.RetryBackoff = time.Second
	}
	if c.RetryBackoffMax == 0 {
		c.RetryBackoffMax = 30 * time.Second
	}
	return nil
}

// walTables lists the outbox tables (not message sources) with the columns
// the decoder reads from each, for wal's checks.
func (c *Config) walTables() []wal.Table {
	var ts []wal.Table
	for _, t := range c.Tables {
		if !t.IsMessage() {
			ts = append(ts, wal.Table{Schema: t.Name.Schema, Name: t.Name.Name, Columns: t.Needed()})
		}
	}
	return ts
}

// Options are hooks for tests and the demo; the zero value is what cdc run
// uses.
type Options struct {
	// KafkaOpts are extra franz-go options, appended last.
	KafkaOpts []kgo.Opt
	// OnSession, if set, is called with each session's tracker once the
	// session streams, so that tests and the demo can watch positions. It
	// must not block.
	OnSession func(*checkpoint.Tracker)
	// OnDelivered, if set, is called with each record and Kafka's answer,
	// after the tracker has counted it. On success the record's partition
	// and offset are set. It runs on franz-go's promise goroutine and must
	// not block.
	OnDelivered func(rec *kgo.Record, err error)
}

// Pipeline streams outbox events from one slot to Kafka.
type Pipeline struct {
	cfg    Config
	opts   Options
	log    hclog.Logger
	router *route.Router
	// IgnoredMessages counts logical decoding messages that were not
	// events (non-transactional, or an unknown prefix); DeadLettered counts
	// events sent to a dead-letter topic.
	IgnoredMessages, DeadLettered atomic.Int64
}

// New validates cfg, which it then owns, and returns a Pipeline. It
// connects to nothing.
func New(cfg Config, log hclog.Logger, opts Options) (*Pipeline, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	r, err := route.New(cfg.Tables)
	if err != nil {
		return nil, err
	}
	return &Pipeline{cfg: cfg, opts: opts, log: log, router: r}, nil
}

// Config returns the validated configuration, defaults filled in.
func (p *Pipeline) Config() Config { return p.cfg }

// Check checks Postgres' and Kafka's preconditions without creating or
// streaming anything.
func (p *Pipeline) Check(ctx context.Context) error {
	if err := wal.Check(ctx, p.cfg.Postgres, p.cfg.walTables()); err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	k, err := sink.New(p.cfg.Kafka, p.log.Named("kafka"), p.opts.KafkaOpts...)
	if err != nil {
		return fmt.Errorf("kafka: %w", err)
	}
	defer k.Close()
	if err := k.Ping(ctx); err != nil {
		return fmt.Errorf("kafka: %w; check kafka.brokers", err)
	}
	return nil
}

// Run streams until ctx is done, then shuts down cleanly and returns nil;
// or until a fatal error, which it returns. Transient errors reconnect with
// backoff.
func (p *Pipeline) Run(ctx context.Context) error {
	first := true
	backoff := p.cfg.RetryBackoff
	for {
		started := time.Now()
		err := p.runSession(ctx, first)
		if ctx.Err() != nil {
			return nil
		}
		if Permanent(err) {
			return err
		}
		if err == nil {
			err = errors.New("session ended without an error")
		}
		first = false
		if time.Since(started) > 2*p.cfg.RetryBackoffMax {
			backoff = p.cfg.RetryBackoff // it ran fine for a while
		}
		var inUse *wal.SlotInUseError
		if errors.As(err, &inUse) {
			p.log.Warn("replication slot is in use; waiting for it", "slot", p.cfg.Postgres.Slot, "error", err, "retry_in", backoff)
		} else {
			p.log.Error("session failed; reconnecting", "error", err, "retry_in", backoff)
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		backoff = min(2*backoff, p.cfg.RetryBackoffMax)
	}
}

// runSession sets up, runs and shuts down one replication session.
func (p *Pipeline) runSession(ctx context.Context, first bool) error {
	slot, err := wal.Setup(ctx, p.cfg.Postgres, p.cfg.walTables(), first, p.log)
	if err != nil {
		return err
	}
	k, err := sink.New(p.cfg.Kafka, p.log.Named("kafka"), p.opts.KafkaOpts...)
	if err != nil {
		return err
	}
	defer k.Close()
	pingCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
	err = k.Ping(pingCtx)
	cancel()
	if err != nil {
		return fmt.Errorf("%w; check kafka.brokers (or CDC_KAFKA_BROKERS) and that the brokers are up", err)
	}

	stream, err := wal.Open(ctx, p.cfg.Postgres, slot.ConfirmedFlush, p.log.Named("wal"))
	if err != nil {
		return err
	}
	s := &session{
		p:       p,
		kafka:   k,
		tracker: checkpoint.NewTracker(slot.ConfirmedFlush, p.cfg.MaxInFlight),
		dec:     decode.New(p.cfg.Tables),
	}
	if p.opts.OnSession != nil {
		p.opts.OnSession(s.tracker)
	}

	watchDone := make(chan struct{})
	defer close(watchDone)
	go p.watchKafka(s.tracker, watchDone)

	runErr := stream.Run(ctx, s.handle, s.tracker)
	if ctx.Err() != nil {
		// Shutdown: stop reading (done), let Kafka answer what is in
		// flight, then confirm what it acked.
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.cfg.ShutdownTimeout)
		if err := k.Flush(fctx); err != nil {
			p.log.Warn("shutdown deadline passed before kafka acked every event; they will be sent again on the next start",
				"in_flight", s.tracker.InFlight(), "timeout", p.cfg.ShutdownTimeout)
		}
		cancel()
	}
	final := stream.Close(context.WithoutCancel(ctx), s.tracker)
	if ctx.Err() != nil {
		p.log.Info("stopped", "slot", p.cfg.Postgres.Slot, "confirmed_lsn", final.String(),
			"dead_lettered", p.DeadLettered.Load(), "ignored_messages", p.IgnoredMessages.Load())
		return nil
	}
	return runErr
}

// session is one replication session: one replication connection, one
// Kafka client, one decoder and one tracker. Its methods follow one event
// as docs/design.md draws it: the stream hands its bytes to handle, the
// decoder turns them into an Event, event has the router make a Record (or
// deadLetter a dead-letter record), produce sends it, and its ack lands in
// the tracker, which the stream reads before its next receive. Everything
// but the ack callback runs on the stream's goroutine.
type session struct {
	p       *Pipeline
	kafka   *sink.Kafka
	tracker *checkpoint.Tracker
	dec     *decode.Decoder
	tx      *checkpoint.Txn // the open transaction, between BEGIN and COMMIT
}

// handle takes one pgoutput message from the stream.
func (s *session) handle(_ pglogrepl.LSN, data []byte) error {
	m, err := s.dec.Decode(data)
	if err != nil {
		return &decodeError{err}
	}
	switch m.Kind {
	case decode.KindBegin:
		s.tx = s.tracker.Begin()
	case decode.KindEvent, decode.KindInvalid:
		return s.event(&m)
	case decode.KindIgnoredMessage:
		s.p.IgnoredMessages.Add(1)
	case decode.KindCommit:
		s.tracker.Commit(s.tx, m.EndLSN)
		s.tx = nil
	}
	return nil
}

// event routes one event and produces its record, or applies the source's
// on_invalid policy when it cannot be delivered as configured.
func (s *session) event(m *decode.Message) error {
	ev := &m.Event
	rec, err := s.record(m)
	if err != nil {
		if rec, err = s.deadLetter(ev, err); err != nil {
			return err
		}
	}
	if s.p.log.IsTrace() {
		s.p.log.Trace("event", "source", ev.Table.String(), "id", ev.ID(), "topic", rec.Topic, "lsn", ev.CommitLSN.String())
	}
	s.produce(rec)
	return nil
}

// record builds m's Kafka record: an *outbox.EventError when m is invalid,
// or the record does not fit kafka.max_message_bytes.
func (s *session) record(m *decode.Message) (*kgo.Record, error) {
	if m.Invalid != nil { // not error(m.Invalid): a nil pointer would be a non-nil error
		return nil, m.Invalid
	}
	rec, err := s.p.router.Record(&m.Event)
	if err != nil {
		return nil, err
	}
	if n, limit := recordSize(rec), int(s.p.cfg.Kafka.MaxMessageBytes); n > limit {
		return nil, outbox.Invalid(&m.Event, "the record is %d bytes, more than kafka.max_message_bytes (%d); raise it together with the topic's max.message.bytes, or make the payload smaller", n, limit)
	}
	return rec, nil
}

// deadLetter applies on_invalid to an event that cannot be delivered: with
// fail it returns cause, which stops the connector; with dead-letter it
// returns the dead-letter record, which is tracked like any event, so that
// its transaction is confirmed only once Kafka acked it.
func (s *session) deadLetter(ev *outbox.Event, cause error) (*kgo.Record, error) {
	if ev.Table.OnInvalid != outbox.OnInvalidDeadLetter {
		return nil, cause
	}
	rec := s.p.router.DeadLetter(ev, cause.Error())
	s.p.DeadLettered.Add(1)
	s.p.log.Warn("event sent to the dead-letter topic", "source", ev.Table.String(), "id", ev.ID(), "lsn", ev.CommitLSN.String(), "topic", rec.Topic, "error", cause)
	return rec, nil
}

// produce counts rec in flight in the open transaction and sends it; the
// ack comes back to the tracker on franz-go's goroutine.
func (s *session) produce(rec *kgo.Record) {
	tx, onDelivered := s.tx, s.p.opts.OnDelivered
	s.tracker.Track(tx)
	s.kafka.Produce(rec, func(err error) {
		s.tracker.Ack(tx, err)
		if onDelivered != nil {
			onDelivered(rec, err)
		}
	})
}

// recordSize estimates a record's size in a batch: franz-go fails a record
// over ProducerBatchMaxBytes on its own, so checking first lets an
// oversized event take the invalid-event policy instead.
func recordSize(r *kgo.Record) int {
	n := len(r.Key) + len(r.Value) + 128 // record and batch framing
	for _, h := range r.Headers {
		n += len(h.Key) + len(h.Value) + 8
	}
	return n
}

// stallAfter is how long Kafka may leave events unacknowledged before the
// connector says so.
const stallAfter = 10 * time.Second

// watchKafka logs once when Kafka stops acknowledging events that are in
// flight, and once when it resumes. It only reads the tracker.
func (p *Pipeline) watchKafka(tr *checkpoint.Tracker, done <-chan struct{}) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	lastAcked, lastProgress, stalled := tr.Acked(), time.Now(), false
	for {
		select {
		case <-done:
			return
		case now := <-t.C:
			acked, inFlight := tr.Acked(), tr.InFlight()
			switch {
			case acked != lastAcked || inFlight == 0:
				if stalled {
					p.log.Info("kafka acknowledges events again", "stalled_for", now.Sub(lastProgress).Round(time.Second).String())
				}
				lastAcked, lastProgress, stalled = acked, now, false
			case !stalled && now.Sub(lastProgress) >= stallAfter:
				p.log.Warn("kafka has not acknowledged any event recently; retrying, and still answering postgres keepalives",
					"for", now.Sub(lastProgress).Round(time.Second).String(), "in_flight", inFlight, "brokers", strings.Join(p.cfg.Kafka.Brokers, ","))
				stalled = true
			}
		}
	}
}

// decodeError marks an undecodable replication message. The same bytes would
// arrive again after a reconnect, so it is fatal.
type decodeError struct{ err error }

func (e *decodeError) Error() string {
	return e.err.Error() + "; the connector cannot continue past this message without losing it: check the tables' definitions against the config"
}
func (e *decodeError) Unwrap() error { return e.err }

// Permanent reports whether err must stop the connector rather than start
// a new session. This is the one place that decides.
func Permanent(err error) bool {
	if err == nil {
		return false
	}
	var (
		setup  *wal.SetupError
		poison *outbox.EventError
		dec    *decodeError
		prod   *sink.ProduceError
	)
	switch {
	case errors.As(err, &setup), errors.As(err, &poison), errors.As(err, &dec):
		return true
	case errors.As(err, &prod):
		return prod.Permanent()
	}
	return false
}
