package delivery

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Confirmer is one session's view of what the replication loop may confirm (it
// implements wal.Acks): the tracker's watermark, but only once a checkpoint at
// or past it is in Kafka. The slot is therefore never ahead of the checkpoint,
// so a slot found ahead of its checkpoint on the next start can only mean that
// something else moved it (docs/design.md, "The slot is not the connector's
// memory").
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
	store    Records
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
func NewConfirmer(tr *Tracker, progress *Progress, store Records, produce func(*kgo.Record, func(error)), prompt, idle time.Duration) *Confirmer {
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
