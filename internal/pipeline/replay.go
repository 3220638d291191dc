package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/decode"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/route"
	"github.com/outboxcdc/cdc/internal/sink"
	"github.com/outboxcdc/cdc/internal/wal"
)

// Range selects transactions by commit LSN or commit time. Zero bounds are
// open: From 0 means from the start of the replay window, To 0 up to the
// WAL end when the replay starts.
type Range struct {
	FromLSN, ToLSN   pglogrepl.LSN // [FromLSN, ToLSN) of commit record LSNs
	FromTime, ToTime time.Time     // [FromTime, ToTime) of commit times
}

func (r Range) String() string {
	from, to := "the window's start", "the WAL end"
	switch {
	case r.FromLSN != 0:
		from = r.FromLSN.String()
	case !r.FromTime.IsZero():
		from = r.FromTime.UTC().Format(time.RFC3339)
	}
	switch {
	case r.ToLSN != 0:
		to = r.ToLSN.String()
	case !r.ToTime.IsZero():
		to = r.ToTime.UTC().Format(time.RFC3339)
	}
	return "[" + from + ", " + to + ")"
}

// Replay says what cdc replay re-sends and where.
type Replay struct {
	Range
	// Tables limits the replay to these sources; empty: every source.
	Tables []*outbox.Table
	// TopicSuffix is appended to every topic, dead-letter topics included.
	TopicSuffix string
	// AggregateTypes, AggregateIDs and EventTypes limit the replay to
	// events whose mapped field is one of them; empty: any. A source that
	// does not map the field has no event that matches.
	AggregateTypes, AggregateIDs, EventTypes []string
}

// fieldFilter is one of Replay's field filters.
type fieldFilter struct {
	field outbox.Field
	flag  string
	want  map[string]bool
}

// matches reports whether ev's field is one of the wanted values. A JSON
// string (a message source's member) matches by its text.
func (ff fieldFilter) matches(ev *outbox.Event) bool {
	v := ev.Fields[ff.field]
	if v.Null() {
		return false
	}
	if ff.want[string(v.B)] {
		return true
	}
	var s string
	return v.Kind == outbox.KindJSON && json.Unmarshal(v.B, &s) == nil && ff.want[s]
}

// fieldFilters builds r's field filters, refusing a filter on a field that
// none of the replayed sources maps: it could only match nothing.
func (r Replay) fieldFilters(all []*outbox.Table) ([]fieldFilter, error) {
	sources := r.Tables
	if len(sources) == 0 {
		sources = all
	}
	var out []fieldFilter
	for _, f := range []struct {
		field  outbox.Field
		flag   string
		values []string
	}{
		{outbox.FieldAggregateType, "--aggregate-type", r.AggregateTypes},
		{outbox.FieldAggregateID, "--aggregate-id", r.AggregateIDs},
		{outbox.FieldEventType, "--event-type", r.EventTypes},
	} {
		if len(f.values) == 0 {
			continue
		}
		mapped := false
		for _, t := range sources {
			mapped = mapped || t.Columns[f.field] != ""
		}
		if !mapped {
			return nil, fmt.Errorf("%s: none of the replayed sources maps %s (tables[].columns), so no event could match", f.flag, f.field)
		}
		ff := fieldFilter{field: f.field, flag: f.flag, want: map[string]bool{}}
		for _, v := range f.values {
			ff.want[v] = true
		}
		out = append(out, ff)
	}
	return out, nil
}

// ReplayProgress is a replay's state, reported while it runs.
type ReplayProgress struct {
	Start, End pglogrepl.LSN // the WAL it reads
	At         pglogrepl.LSN // the commit LSN of the transaction it is at
	Events     int64         // events sent
	Acked      uint64        // of those, acknowledged by Kafka
}

// ReplaySummary is what a finished replay did.
type ReplaySummary struct {
	ReplayProgress
	Skipped                 int64         // events read in the WAL but outside the range, tables or filters
	Transactions            int64         // transactions with at least one event sent
	FirstCommit, LastCommit pglogrepl.LSN // commit LSNs of the first and last transaction sent
	FirstTime, LastTime     time.Time     // and their commit times
	Elapsed                 time.Duration
}

// OutsideWindowError is a replay or rewind that asks for WAL the replay
// window no longer holds.
type OutsideWindowError struct {
	Asked        string
	First        pglogrepl.LSN // the window's first position
	FirstTime    time.Time     // transactions that committed from this time on are in it (zero: unknown)
	Window       time.Duration
	ReplaySlot   string
	NoCheckpoint bool
}

func (e *OutsideWindowError) Error() string {
	since := "its first commit time is not recorded yet"
	if !e.FirstTime.IsZero() {
		since = "it holds the transactions that committed from " + e.FirstTime.UTC().Format(time.RFC3339) + " on"
	}
	return fmt.Sprintf("%s is outside the replay window: slot %q starts at %s and %s (replay.window is %s); start at or after that, or keep a longer window",
		e.Asked, e.ReplaySlot, e.First, since, e.Window)
}

// errReplayDone ends a replay's stream once it has read to its end.
var errReplayDone = errors.New("replay reached its end")

// Replay re-sends the transactions of r from the replay window, through
// the same routing and formats, and waits until Kafka acknowledged every
// event. It runs beside the main connector: it streams a temporary copy of
// the replay slot, made on its own replication connection, so that the
// copy vanishes with the connection however the replay ends
// (docs/design.md, rule 17). progress, if set, is called about four times a
// second from another goroutine.
func (p *Pipeline) Replay(ctx context.Context, r Replay, progress func(ReplayProgress)) (ReplaySummary, error) {
	started := time.Now()
	if p.cfg.Replay.Window == 0 {
		return ReplaySummary{}, &wal.SetupError{Msg: "no replay window: set replay.window (for example 24h) in the config and let the connector run; a replay reaches back only as far as the window"}
	}
	if err := route.ValidTopic("x" + r.TopicSuffix); r.TopicSuffix != "" && err != nil {
		return ReplaySummary{}, fmt.Errorf("--topic-suffix %q: use only letters, digits, '.', '_' and '-'", r.TopicSuffix)
	}
	fields, err := r.fieldFilters(p.cfg.Tables)
	if err != nil {
		return ReplaySummary{}, err
	}
	conn, err := wal.Connect(ctx, p.cfg.Postgres, p.log.Named("wal"))
	if err != nil {
		return ReplaySummary{}, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rec, err := p.loadRecord(ctx, conn.System())
	if err != nil {
		return ReplaySummary{}, err
	}
	// The end: what has committed when the replay starts (or ToLSN).
	end, err := conn.CurrentWAL(ctx)
	if err != nil {
		return ReplaySummary{}, err
	}
	if r.ToLSN != 0 && r.ToLSN < end {
		end = r.ToLSN
	}

	// A name unique to this process, that says whose it is.
	tmp := p.cfg.Postgres.Slot
	if len(tmp) > 40 {
		tmp = tmp[:40]
	}
	tmp = fmt.Sprintf("%s_rp_%d", tmp, os.Getpid())
	held, err := conn.CopySlot(ctx, p.cfg.ReplaySlot(), tmp, true)
	if err != nil {
		return ReplaySummary{}, fmt.Errorf("%w; is the connector running with replay.window set? it creates the replay slot", err)
	}
	start, err := p.windowStart(r.Range, rec, held)
	if err != nil {
		return ReplaySummary{}, err
	}
	if start > held {
		// The server decodes its way forward, cheaper than sending it.
		if start, err = conn.AdvanceSlot(ctx, tmp, start); err != nil {
			return ReplaySummary{}, err
		}
	} else {
		start = held
	}

	k, err := sink.New(p.cfg.Kafka, p.log.Named("kafka"), p.kafkaOpts()...)
	if err != nil {
		return ReplaySummary{}, err
	}
	defer k.Close()
	stream, err := conn.Start(ctx, tmp, start)
	if err != nil {
		return ReplaySummary{}, err
	}
	f := &replayFilter{Range: r.Range, end: end, suffix: r.TopicSuffix, fields: fields}
	if len(r.Tables) > 0 {
		f.tables = map[*outbox.Table]bool{}
		for _, t := range r.Tables {
			f.tables[t] = true
		}
	}
	s := &session{p: p, kafka: k, tracker: p.newTracker(start), dec: decode.New(p.cfg.Tables), replay: f, ctx: ctx}
	acks := &replayAcks{Tracker: s.tracker, f: f, kafka: k}

	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	report := func() ReplayProgress {
		return ReplayProgress{Start: start, End: end, At: pglogrepl.LSN(f.at.Load()), Events: f.sent.Load(), Acked: s.tracker.Acked()}
	}
	stopReports := make(chan struct{})
	reportsDone := make(chan struct{})
	go func() {
		defer close(reportsDone)
		for {
			select {
			case <-stopReports:
				return
			case <-tick.C:
				if progress != nil {
					progress(report())
				}
			}
		}
	}()
	runErr := stream.Run(ctx, s.handle, acks)
	if errors.Is(runErr, errReplayDone) {
		runErr = nil
		// Every event is produced: wait for Kafka to acknowledge them.
		if err := k.Flush(ctx); err != nil {
			runErr = fmt.Errorf("wait for kafka's acks: %w", err)
		} else if err := s.tracker.Err(); err != nil {
			runErr = err
		}
	}
	close(stopReports)
	<-reportsDone
	stream.Close(context.WithoutCancel(ctx), acks)
	sum := ReplaySummary{ReplayProgress: report(), Skipped: f.skipped, Transactions: f.txns,
		FirstCommit: f.firstLSN, LastCommit: f.lastLSN, FirstTime: f.firstTime, LastTime: f.lastTime, Elapsed: time.Since(started)}
	if progress != nil {
		progress(sum.ReplayProgress)
	}
	if runErr == nil && ctx.Err() != nil {
		runErr = ctx.Err()
	}
	return sum, runErr
}

// loadRecord reads the pipeline's checkpoint for the operator commands.
func (p *Pipeline) loadRecord(ctx context.Context, sys wal.System) (checkpoint.Record, error) {
	store, err := checkpoint.OpenStore(ctx, p.cfg.Checkpoint.Topic, sink.ClientOpts(p.cfg.Kafka, p.log.Named("kafka")), p.log.Named("checkpoint"))
	if err != nil {
		return checkpoint.Record{}, err
	}
	p.store = store
	recs, err := store.Load(ctx, false)
	if err != nil {
		return checkpoint.Record{}, err
	}
	rec, ok := recs[checkpoint.Key(p.cfg.Postgres.Slot, sys.ID)]
	if !ok {
		return checkpoint.Record{}, &wal.SetupError{Msg: fmt.Sprintf("no checkpoint for slot %q of database system %s in topic %q: start the connector (cdc run) with this config first", p.cfg.Postgres.Slot, sys.ID, p.cfg.Checkpoint.Topic)}
	}
	return rec, nil
}

// windowStart is the WAL position from which the replay slot, holding WAL
// from held on, yields every transaction of r, or an *OutsideWindowError.
// For a time, it is the newest replay mark safely before it, or the window's
// start when the time is inside the window.
func (p *Pipeline) windowStart(r Range, rec checkpoint.Record, held pglogrepl.LSN) (pglogrepl.LSN, error) {
	outside := func(asked string) error {
		return &OutsideWindowError{Asked: asked, First: max(held, rec.Window.LSN), FirstTime: rec.Window.Time, Window: p.cfg.Replay.Window, ReplaySlot: p.cfg.ReplaySlot()}
	}
	switch {
	case r.FromLSN != 0:
		if r.FromLSN < held {
			return 0, outside("LSN " + r.FromLSN.String())
		}
		return r.FromLSN, nil
	case !r.FromTime.IsZero():
		var start pglogrepl.LSN
		found := false
		if m, ok := rec.Marks.Before(r.FromTime); ok {
			start, found = m.LSN, true
		}
		if w := rec.Window; w.LSN != 0 && !r.FromTime.Before(w.Time) && w.LSN > start {
			start, found = w.LSN, true
		}
		if !found || start < held {
			return 0, outside(r.FromTime.UTC().Format(time.RFC3339))
		}
		return start, nil
	}
	return held, nil
}

// replayFilter selects the transactions and sources a replay re-sends. Its
// counters are written by the stream's goroutine; at and sent are read by
// the progress reports too.
type replayFilter struct {
	Range
	end    pglogrepl.LSN
	suffix string
	tables map[*outbox.Table]bool // nil: every source
	fields []fieldFilter          // all must match

	inRange bool
	open    bool // between BEGIN and COMMIT
	done    atomic.Bool
	at      atomic.Uint64
	sent    atomic.Int64
	txnSent bool

	skipped             int64
	txns                int64
	firstLSN, lastLSN   pglogrepl.LSN
	firstTime, lastTime time.Time
}

// begin decides whether the transaction m begins is in the range, and ends
// the replay at the first one past its end.
func (f *replayFilter) begin(m *decode.Message) error {
	f.at.Store(uint64(m.Commit))
	f.txnSent, f.open = false, true
	// Commit times follow commit LSNs only roughly: keep reading Skew past
	// ToTime so that a transaction that took its timestamp early is seen.
	if m.Commit >= f.end || (!f.ToTime.IsZero() && !m.CommitTime.Before(f.ToTime.Add(checkpoint.Skew))) {
		f.done.Store(true)
		return errReplayDone
	}
	f.inRange = m.Commit >= f.FromLSN && (f.ToLSN == 0 || m.Commit < f.ToLSN) &&
		!m.CommitTime.Before(f.FromTime) && (f.ToTime.IsZero() || m.CommitTime.Before(f.ToTime))
	return nil
}

// commit closes the transaction.
func (f *replayFilter) commit() { f.open = false }

// take reports whether ev is re-sent, counting it.
func (f *replayFilter) take(ev *outbox.Event) bool {
	if !f.inRange || (f.tables != nil && !f.tables[ev.Table]) {
		f.skipped++
		return false
	}
	for _, ff := range f.fields {
		if !ff.matches(ev) {
			f.skipped++
			return false
		}
	}
	f.sent.Add(1)
	if !f.txnSent {
		f.txnSent = true
		f.txns++
		if f.firstLSN == 0 {
			f.firstLSN, f.firstTime = ev.CommitLSN, ev.CommitTime
		}
		f.lastLSN, f.lastTime = ev.CommitLSN, ev.CommitTime
	}
	return true
}

// replayAcks is the replay stream's wal.Acks: the tracker, plus the end of
// the replay when a keepalive shows the server has decoded past its end
// with no transaction open. Events still in flight are waited for after.
type replayAcks struct {
	*checkpoint.Tracker
	f     *replayFilter
	kafka *sink.Kafka
}

// Release lets batched records go (wal.Releaser).
func (a *replayAcks) Release(now time.Time) time.Time { return a.kafka.Release(now) }

func (a *replayAcks) Keepalive(walEnd pglogrepl.LSN, at time.Time) {
	a.Tracker.Keepalive(walEnd, at)
	if walEnd >= a.f.end && !a.f.open {
		a.f.done.Store(true)
	}
}

func (a *replayAcks) Err() error {
	if err := a.Tracker.Err(); err != nil {
		return err
	}
	if a.f.done.Load() {
		return errReplayDone
	}
	return nil
}
