package checkpoint

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Progress is a pipeline's durable progress across its sessions: the last
// checkpoint Kafka acknowledged, and what the next one will add (replay
// marks, the replay window). It is safe for concurrent use.
type Progress struct {
	window time.Duration // the replay window; 0 without one

	mu      sync.Mutex
	saved   Record
	pending *Mark // a replay window not saved yet
	// retention is the retention marks the next record carries (nil:
	// the saved record's).
	retention []RetentionMark
}

// NewProgress starts from rec, the checkpoint the pipeline found or wrote
// first. window is the replay window (0: none), which sets how long marks
// are kept.
func NewProgress(rec Record, window time.Duration) *Progress {
	return &Progress{saved: rec, window: window}
}

// Saved returns the last acknowledged checkpoint.
func (p *Progress) Saved() Record {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.saved
}

// MarkEvery is how far apart replay marks are: 64 a window, at least a
// second apart. The replay slot lags the window by up to this.
func MarkEvery(window time.Duration) time.Duration { return max(window/64, time.Second) }

// SetWindow asks that the next checkpoint record the replay window at m.
// Advance the replay slot only to the window of a saved checkpoint
// (Saved().Window): the slot must never be ahead of the window a saved
// checkpoint claims, or a replay that trusts the checkpoint would start
// past what the slot holds.
func (p *Progress) SetWindow(m Mark) {
	p.mu.Lock()
	p.pending = &m
	p.mu.Unlock()
}

// SetRetentionMarks has the next checkpoints carry marks (RetentionMarks),
// which must not change afterwards.
func (p *Progress) SetRetentionMarks(marks []RetentionMark) {
	p.mu.Lock()
	p.retention = marks
	p.mu.Unlock()
}

// durable is the saved checkpoint's confirmed and commit LSNs, without
// copying the record: the replication loop asks for them at every message.
func (p *Progress) durable() (confirmed, commit pglogrepl.LSN) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.saved.Confirmed, p.saved.CommitLSN
}

func (p *Progress) windowPending() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pending != nil && p.pending.LSN > p.saved.Window.LSN
}

// Next is the record to write for pos: exactly-once delivery writes it in
// its Kafka transaction.
func (p *Progress) Next(pos Position, now time.Time) Record { return p.next(pos, now) }

// next is the record to write for pos.
func (p *Progress) next(pos Position, now time.Time) Record {
	p.mu.Lock()
	defer p.mu.Unlock()
	r := p.saved
	r.History = append([]Event(nil), r.History...)
	if pos.LSN > r.Confirmed {
		r.Confirmed = pos.LSN
	}
	if pos.CommitLSN > r.CommitLSN {
		r.CommitLSN, r.CommitTime = pos.CommitLSN, pos.CommitTime
	}
	r.UpdatedAt = now
	if p.window > 0 && !pos.Time.IsZero() {
		every := MarkEvery(p.window)
		r.Marks = append(Marks(nil), r.Marks...).Add(Mark{LSN: pos.LSN, Time: pos.Time}, every, now.Add(-p.window-2*every))
	}
	if p.pending != nil && p.pending.LSN > r.Window.LSN {
		r.Window = *p.pending
	}
	if pos.Backfills != nil {
		r.Backfills = *pos.Backfills
	}
	if pos.Tables != nil {
		r.Tables = pos.Tables
	}
	if p.retention != nil {
		r.RetentionMarks = p.retention
	}
	if len(r.Skips) > 0 {
		// A skip is done once its transaction is delivered.
		r.Skips = slices.DeleteFunc(slices.Clone(r.Skips), func(s Skip) bool { return s.CommitLSN <= r.CommitLSN })
	}
	return r
}

// SaveNow writes the saved checkpoint, changed by edit, through produce
// (the session's producer), and waits for Kafka's ack: progress made
// outside the watermark, as a first start's backfill, before the stream
// runs, makes it.
func (p *Progress) SaveNow(ctx context.Context, store *Store, produce func(*kgo.Record, func(error)), edit func(*Record)) error {
	rec := p.Saved()
	edit(&rec)
	rec.UpdatedAt = time.Now()
	kr, err := store.NewRecord(rec)
	if err != nil {
		return err
	}
	done := make(chan error, 1)
	produce(kr, func(err error) { done <- err })
	select {
	case err := <-done:
		if err != nil {
			return err
		}
	case <-ctx.Done():
		return ctx.Err()
	}
	p.Store(rec)
	return nil
}

// Store records r, written and acknowledged outside a session (the first
// start's backfill), as the saved checkpoint.
func (p *Progress) Store(r Record) { p.acked(r) }

func (p *Progress) acked(r Record) {
	p.mu.Lock()
	if r.Confirmed >= p.saved.Confirmed {
		p.saved = r
	}
	p.mu.Unlock()
}

// Confirmer is one session's view of what the replication loop may confirm
// (it implements wal.Acks): the tracker's watermark, but only once a
// checkpoint at or past it is in Kafka. The slot is therefore never ahead
// of the checkpoint, so a slot found ahead of its checkpoint on the next
// start can only mean that something else moved it (docs/design.md, rule
// 16).
//
// Confirmed starts a checkpoint write when the watermark has passed the
// last one, one at a time, and never blocks. A watermark that passed new
// transactions is written at most once every prompt interval, so that
// confirms follow acks closely; one that only followed keepalives (a quiet
// outbox in a busy database) at most once every idle interval, so that it
// costs no more than the status updates do.
type Confirmer struct {
	tr       *Tracker
	progress *Progress
	store    *Store
	produce  func(*kgo.Record, func(error))
	prompt   time.Duration
	idle     time.Duration

	onSaved func()

	mu      sync.Mutex
	writing chan struct{} // closed when the write in flight is answered
	last    time.Time
	err     error
}

// NewConfirmer writes checkpoints of tr's watermark to store's topic with
// produce (the session's producer): at most once every prompt interval
// when transactions were resolved, once every idle interval otherwise.
func NewConfirmer(tr *Tracker, progress *Progress, store *Store, produce func(*kgo.Record, func(error)), prompt, idle time.Duration) *Confirmer {
	return &Confirmer{tr: tr, progress: progress, store: store, produce: produce, prompt: prompt, idle: max(idle, prompt)}
}

// OnSaved sets a function called after each acknowledged checkpoint, on
// the producer's goroutine; it must not block. Call it before use.
func (c *Confirmer) OnSaved(f func()) { c.onSaved = f }

// Confirmed is the position safe to confirm: the watermark, up to the last
// acknowledged checkpoint.
func (c *Confirmer) Confirmed() pglogrepl.LSN {
	pos := c.tr.Position()
	durable, commit := c.progress.durable()
	c.mu.Lock()
	if c.writing == nil && c.err == nil {
		every := c.idle
		if pos.CommitLSN > commit {
			every = c.prompt
		}
		if time.Since(c.last) >= every && (pos.LSN > durable || c.progress.windowPending()) {
			c.writeLocked(pos)
		}
	}
	c.mu.Unlock()
	return min(pos.LSN, durable)
}

// Owed reports whether events were handed on that are not confirmable yet:
// a transaction open or in flight, or resolved but not in a checkpoint.
func (c *Confirmer) Owed() bool {
	if !c.tr.Idle() {
		return true
	}
	_, commit := c.progress.durable()
	return c.tr.Position().CommitLSN > commit
}

// writeLocked starts writing a checkpoint at pos.
func (c *Confirmer) writeLocked(pos Position) {
	rec := c.progress.next(pos, time.Now())
	kr, err := c.store.NewRecord(rec)
	if err != nil {
		c.err = err
		return
	}
	done := make(chan struct{})
	c.writing, c.last = done, time.Now()
	c.produce(kr, func(err error) {
		c.mu.Lock()
		if err != nil && c.err == nil {
			c.err = err
		}
		if err == nil {
			c.progress.acked(rec)
			if c.onSaved != nil {
				c.onSaved()
			}
		}
		c.writing = nil
		c.mu.Unlock()
		close(done)
		c.tr.Notify()
	})
}

// Final writes a checkpoint at the watermark, if it moved, and waits for it
// (or ctx). Shutdown calls it after Kafka acked the events in flight and
// before the last status update.
func (c *Confirmer) Final(ctx context.Context) error {
	for {
		c.mu.Lock()
		w := c.writing
		if w == nil {
			if c.err != nil {
				c.mu.Unlock()
				return c.err
			}
			pos := c.tr.Position()
			if pos.LSN <= c.progress.Saved().Confirmed && !c.progress.windowPending() {
				c.mu.Unlock()
				return nil
			}
			c.writeLocked(pos)
			w = c.writing
			if w == nil { // encoding failed
				err := c.err
				c.mu.Unlock()
				return err
			}
		}
		c.mu.Unlock()
		select {
		case <-w:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Keepalive passes a keepalive on to the tracker.
func (c *Confirmer) Keepalive(walEnd pglogrepl.LSN, at time.Time) { c.tr.Keepalive(walEnd, at) }

// Saturated is the tracker's.
func (c *Confirmer) Saturated() bool { return c.tr.Saturated() }

// Changed is the tracker's; checkpoint acks signal it too.
func (c *Confirmer) Changed() <-chan struct{} { return c.tr.Changed() }

// Err is the first delivery failure: an event's or a checkpoint's.
func (c *Confirmer) Err() error {
	if err := c.tr.Err(); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}
