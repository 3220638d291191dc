package delivery

import (
	"context"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/checkpoint"
)

// Settler lets Kafka have what a session sent so far, in the middle of a
// Postgres transaction (a redrive runs in its announcement's): at least
// once, by waiting for the acks; exactly once, by committing the open
// Kafka transaction, with a checkpoint an edit may change, and opening
// the next. Its functions run on the stream's goroutine; Blocking keeps
// the slot's lease while they wait.
type Settler struct {
	Tracker   *Tracker
	Committer *Committer // nil at least once
	Progress  *Progress
	Store     Records
	// Produce is the session's producer, for a checkpoint at least once;
	// Release sends the records its batching holds.
	Produce  func(*kgo.Record, func(error))
	Release  func()
	Blocking func(func() error) error
}

// All waits until Kafka acknowledged every record sent, and exactly once
// commits them (checkpoint of the position as it is) and opens the next
// transaction.
func (s Settler) All(ctx context.Context) error {
	s.Release()
	if err := s.Blocking(func() error { return s.Tracker.WaitRoom(ctx, 0, -1) }); err != nil || s.Committer == nil {
		return err
	}
	if err := s.Blocking(func() error { return s.Committer.CommitNow(ctx, nil) }); err != nil {
		return err
	}
	return s.Committer.Begin()
}

// Room waits until at most n records and bytes bytes are in flight; exactly
// once it commits what is open instead, with edit's checkpoint, and opens
// the next transaction: a chunk of a redrive is then never sent twice.
func (s Settler) Room(ctx context.Context, n int, bytes int64, edit func(*checkpoint.Record)) error {
	s.Release()
	if s.Committer == nil {
		return s.Blocking(func() error { return s.Tracker.WaitRoom(ctx, n, bytes) })
	}
	if err := s.Blocking(func() error { return s.Committer.CommitNow(ctx, edit) }); err != nil {
		return err
	}
	return s.Committer.Begin()
}

// Save waits until Kafka acknowledged every record sent, then writes the
// checkpoint of what is delivered, changed by edit, and waits for it
// (exactly once: commits it with what is open).
func (s Settler) Save(ctx context.Context, edit func(*checkpoint.Record)) error {
	s.Release()
	if err := s.Blocking(func() error { return s.Tracker.WaitRoom(ctx, 0, -1) }); err != nil {
		return err
	}
	if s.Committer != nil {
		return s.Blocking(func() error { return s.Committer.CommitNow(ctx, edit) })
	}
	return s.Blocking(func() error { return s.Progress.SaveNow(ctx, s.Store, s.Produce, edit) })
}
