package replay

import (
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/decode"
	"github.com/outboxcdc/cdc/internal/delivery"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/park"
	"github.com/outboxcdc/cdc/internal/route"
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

// Request says what cdc replay re-sends and where.
type Request struct {
	Range
	// Tables limits the replay to these sources; empty: every source.
	Tables []*outbox.Source
	// TopicSuffix is appended to every topic, dead-letter topics included.
	TopicSuffix string
	// AggregateTypes, AggregateIDs and EventTypes limit the replay to
	// events whose mapped field is one of them; empty: any. A source that
	// does not map the field has no event that matches.
	AggregateTypes, AggregateIDs, EventTypes []string
}

// fieldFilter is one of Request's field filters.
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
func (r Request) fieldFilters(all []*outbox.Source) ([]fieldFilter, error) {
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

// Status is a replay's state, reported while it runs.
type Status struct {
	Start, End pglogrepl.LSN // the WAL it reads
	At         pglogrepl.LSN // the commit LSN of the transaction it is at
	Events     int64         // events sent
	Acked      uint64        // of those, acknowledged by Kafka
}

// Summary is what a finished replay did.
type Summary struct {
	Status
	Skipped                 int64         // events read in the WAL but outside the range, tables or filters
	LeftOut                 int64         // events in them that their table's filter left out: not sent
	Held                    int64         // events in them of keys parked since before them: not sent (HoldParked)
	Transactions            int64         // transactions with at least one event taken (sent or left out)
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
		// Whole seconds, rounded up: a --from-time of the time printed
		// must be inside.
		from := e.FirstTime.Truncate(time.Second)
		if from.Before(e.FirstTime) {
			from = from.Add(time.Second)
		}
		since = "it holds the transactions that committed from " + from.UTC().Format(time.RFC3339) + " on"
	}
	return fmt.Sprintf("%s is outside the replay window: slot %q starts at %s and %s (replay.window is %s); start at or after that, or keep a longer window",
		e.Asked, e.ReplaySlot, e.First, since, e.Window)
}

// ErrDone ends a replay's stream once it has read to its end.
var ErrDone = errors.New("replay reached its end")

// Filter selects the transactions and sources a replay re-sends. Its
// counters are written by the stream's goroutine; at and sent are read by
// the progress reports too.
type Filter struct {
	Range
	end    pglogrepl.LSN
	suffix string
	tables map[*outbox.Source]bool // nil: every source
	fields []fieldFilter           // all must match

	inRange bool
	open    bool // between BEGIN and COMMIT
	done    atomic.Bool
	at      atomic.Uint64
	sent    atomic.Int64
	txnSent bool

	skipped             int64
	leftOut             int64
	held                int64
	parked              map[string]pglogrepl.LSN // HoldParked's
	txns                int64
	firstLSN, lastLSN   pglogrepl.LSN
	firstTime, lastTime time.Time
}

// Begin decides whether the transaction m begins is in the range, and ends
// the replay at the first one past its end.
func (f *Filter) Begin(m *decode.Message) error {
	f.at.Store(uint64(m.Commit))
	f.txnSent, f.open = false, true
	// Commit times follow commit LSNs only roughly: keep reading Skew past
	// ToTime so that a transaction that took its timestamp early is seen.
	if m.Commit >= f.end || (!f.ToTime.IsZero() && !m.CommitTime.Before(f.ToTime.Add(checkpoint.Skew))) {
		f.done.Store(true)
		return ErrDone
	}
	f.inRange = m.Commit >= f.FromLSN && (f.ToLSN == 0 || m.Commit < f.ToLSN) &&
		!m.CommitTime.Before(f.FromTime) && (f.ToTime.IsZero() || m.CommitTime.Before(f.ToTime))
	return nil
}

// Commit closes the transaction.
func (f *Filter) Commit() { f.open = false }

// Take reports whether ev is re-sent, counting it.
func (f *Filter) Take(ev *outbox.Event) bool {
	if !f.inRange || (f.tables != nil && !f.tables[ev.Source]) {
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

// LeftOut takes back the count of ev, taken, that its table's filter left
// out: a replay sends what the stream would (docs/config.md,
// "Expressions").
func (f *Filter) LeftOut(*outbox.Event) {
	f.sent.Add(-1)
	f.leftOut++
}

// HoldParked has the replay keep back the events of the keys parked
// (the checkpoint's list) that committed at or after their parking's
// first event: the parking holds them, behind that event, and a redrive
// sends them on; re-sent now, they would reach the key's topic before it
// (docs/operations.md, "Replay"). A replay to topics of their own (a
// suffix) holds nothing back: the parked topics' order is not theirs.
func (f *Filter) HoldParked(list []checkpoint.Parked) {
	if f.suffix != "" || len(list) == 0 {
		return
	}
	f.parked = map[string]pglogrepl.LSN{}
	for _, p := range list {
		if at, ok := f.parked[p.Key]; !ok || p.FirstLSN < at {
			f.parked[p.Key] = p.FirstLSN
		}
	}
}

// Held reports whether ev, taken, with record key key, is held back
// (HoldParked), and takes back its count.
func (f *Filter) Held(ev *outbox.Event, key []byte) bool {
	if len(f.parked) == 0 {
		return false
	}
	if at, ok := park.Find(f.parked, key); !ok || ev.CommitLSN < at { // by KeyID, as the checkpoint names it
		return false
	}
	f.sent.Add(-1)
	f.held++
	return true
}

// Acks is the replay stream's wal.Acks: the tracker, plus the end of
// the replay when a keepalive shows the server has decoded past its end
// with no transaction open. Events still in flight are waited for after.
type Acks struct {
	*delivery.Tracker
	f *Filter
}

func (a *Acks) Keepalive(walEnd pglogrepl.LSN, at time.Time) {
	a.Tracker.Keepalive(walEnd, at)
	if walEnd >= a.f.end && !a.f.open {
		a.f.done.Store(true)
	}
}

func (a *Acks) Err() error {
	if err := a.Tracker.Err(); err != nil {
		return err
	}
	if a.f.done.Load() {
		return ErrDone
	}
	return nil
}

// NewFilter is the filter of request r over the configured sources all. It
// refuses a topic suffix Kafka would not take, and a field filter that
// could match nothing. EndAt sets where it ends.
func NewFilter(r Request, all []*outbox.Source) (*Filter, error) {
	if err := route.ValidTopic("x" + r.TopicSuffix); r.TopicSuffix != "" && err != nil {
		return nil, fmt.Errorf("--topic-suffix %q: use only letters, digits, '.', '_' and '-'", r.TopicSuffix)
	}
	fields, err := r.fieldFilters(all)
	if err != nil {
		return nil, err
	}
	f := &Filter{Range: r.Range, suffix: r.TopicSuffix, fields: fields}
	if len(r.Tables) > 0 {
		f.tables = map[*outbox.Source]bool{}
		for _, t := range r.Tables {
			f.tables[t] = true
		}
	}
	return f, nil
}

// EndAt ends the replay at end: the WAL end when it starts, or ToLSN.
func (f *Filter) EndAt(end pglogrepl.LSN) { f.end = end }

// Suffix is what the replay appends to every topic.
func (f *Filter) Suffix() string { return f.suffix }

// Progress is the replay's state, acked the events Kafka acknowledged;
// safe from any goroutine.
func (f *Filter) Progress(start pglogrepl.LSN, acked uint64) Status {
	return Status{Start: start, End: f.end, At: pglogrepl.LSN(f.at.Load()), Events: f.sent.Load(), Acked: acked}
}

// Summary is what the replay did, once its stream has stopped.
func (f *Filter) Summary(p Status, elapsed time.Duration) Summary {
	return Summary{Status: p, Skipped: f.skipped, LeftOut: f.leftOut, Held: f.held, Transactions: f.txns,
		FirstCommit: f.firstLSN, LastCommit: f.lastLSN, FirstTime: f.firstTime, LastTime: f.lastTime, Elapsed: elapsed}
}

// NewAcks is the replay stream's wal.Acks over its tracker and producer.
func NewAcks(tr *delivery.Tracker, f *Filter) *Acks {
	return &Acks{Tracker: tr, f: f}
}

// WindowStart is the WAL position from which the replay slot, holding WAL
// from held on, yields every transaction of r, or an *OutsideWindowError;
// rec is the pipeline's checkpoint, window replay.window, and replaySlot
// the slot's name, for the error. For a time, it is the newest replay mark
// safely before it, or the window's start when the time is inside the
// window.
func WindowStart(r Range, rec checkpoint.Record, held pglogrepl.LSN, window time.Duration, replaySlot string) (pglogrepl.LSN, error) {
	outside := func(asked string) error {
		return &OutsideWindowError{Asked: asked, First: max(held, rec.Window.LSN), FirstTime: rec.Window.Time, Window: window, ReplaySlot: replaySlot}
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
