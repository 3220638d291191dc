package delivery

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Records makes the Kafka record that stores a checkpoint: a
// *checkpoint.Store, which names the topic and signs the record.
type Records interface {
	NewRecord(checkpoint.Record) (*kgo.Record, error)
}

// Progress is a pipeline's durable progress across its sessions: the last
// checkpoint Kafka acknowledged, and what the next one will add (replay
// marks, the replay window). It is safe for concurrent use.
type Progress struct {
	window time.Duration // the replay window; 0 without one

	mu      sync.Mutex
	saved   checkpoint.Record
	pending *checkpoint.Mark // a replay window not saved yet
	// retention is the retention marks the next record carries (nil:
	// the saved record's).
	retention []checkpoint.RetentionMark
}

// NewProgress starts from rec, the checkpoint the pipeline found or wrote
// first. window is the replay window (0: none), which sets how long marks
// are kept.
func NewProgress(rec checkpoint.Record, window time.Duration) *Progress {
	return &Progress{saved: rec, window: window}
}

// Saved returns the last acknowledged checkpoint.
func (p *Progress) Saved() checkpoint.Record {
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
func (p *Progress) SetWindow(m checkpoint.Mark) {
	p.mu.Lock()
	p.pending = &m
	p.mu.Unlock()
}

// SetRetentionMarks has the next checkpoints carry marks (RetentionMarks),
// which must not change afterwards.
func (p *Progress) SetRetentionMarks(marks []checkpoint.RetentionMark) {
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
func (p *Progress) Next(pos Position, now time.Time) checkpoint.Record { return p.next(pos, now) }

// next is the record to write for pos.
func (p *Progress) next(pos Position, now time.Time) checkpoint.Record {
	p.mu.Lock()
	defer p.mu.Unlock()
	r := p.saved
	r.Seq++
	r.History = append([]checkpoint.Jump(nil), r.History...)
	if pos.LSN > r.Confirmed {
		r.Confirmed = pos.LSN
	}
	if pos.CommitLSN > r.CommitLSN {
		r.CommitLSN, r.CommitTime = pos.CommitLSN, pos.CommitTime
	}
	r.UpdatedAt = now
	if p.window > 0 && !pos.Time.IsZero() {
		every := MarkEvery(p.window)
		r.Marks = append(checkpoint.Marks(nil), r.Marks...).Add(checkpoint.Mark{LSN: pos.LSN, Time: pos.Time}, every, now.Add(-p.window-2*every))
	}
	if p.pending != nil && p.pending.LSN > r.Window.LSN {
		r.Window = *p.pending
	}
	if pos.Backfills != nil {
		r.Backfills = *pos.Backfills
	}
	if pos.Tables != nil {
		r.Tables = checkpoint.NoteTables(r.Tables, pos.Tables)
	}
	if pos.Parked != nil {
		r.Parked = *pos.Parked
	}
	if pos.Used != nil {
		r.Used = *pos.Used
	}
	if p.retention != nil {
		r.RetentionMarks = p.retention
	}
	if len(r.Skips) > 0 {
		// A skip is done once its transaction is delivered.
		r.Skips = slices.DeleteFunc(slices.Clone(r.Skips), func(s checkpoint.Skip) bool { return s.CommitLSN <= r.CommitLSN })
	}
	return r
}

// SaveNow writes the saved checkpoint, changed by edit, through produce
// (the session's producer), and waits for Kafka's ack: progress made
// outside the watermark, as a first start's backfill, before the stream
// runs, makes it.
func (p *Progress) SaveNow(ctx context.Context, store Records, produce func(*kgo.Record, func(error)), edit func(*checkpoint.Record)) error {
	rec := p.Saved()
	seq := rec.Seq + 1
	edit(&rec)
	rec.UpdatedAt, rec.Seq = time.Now(), seq
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
func (p *Progress) Store(r checkpoint.Record) { p.acked(r) }

func (p *Progress) acked(r checkpoint.Record) {
	p.mu.Lock()
	if r.Confirmed >= p.saved.Confirmed {
		p.saved = r
	}
	p.mu.Unlock()
}
