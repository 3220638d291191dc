package delivery

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/twmb/franz-go/pkg/kgo"
)

// pendingWrites is a produce function that holds each checkpoint record
// until the test answers it.
type pendingWrites struct{ acks []func(error) }

func (w *pendingWrites) produce(_ *kgo.Record, ack func(error)) { w.acks = append(w.acks, ack) }

func (w *pendingWrites) answerAll() {
	acks := w.acks
	w.acks = nil
	for _, ack := range acks {
		ack(nil)
	}
}

// TestConfirmerPromptForEventsIdleForKeepalives: a watermark that passed new
// transactions is checkpointed (and so confirmable) at the prompt interval;
// one moved only by keepalives waits for the idle interval; never more than
// one write is in flight; and Confirmed never passes the saved checkpoint.
func TestConfirmerPromptForEventsIdleForKeepalives(t *testing.T) {
	const prompt, idle = 5 * time.Millisecond, time.Hour
	tr := NewTracker(100, 10)
	w := &pendingWrites{}
	c := NewConfirmer(tr, NewProgress(checkpoint.Record{Slot: "s", Confirmed: 100}, 0), topicRecords("cp"), w.produce, prompt, idle)

	if c.Owed() {
		t.Fatal("Owed with nothing handed on")
	}
	tx := tr.Begin(time.Now())
	tr.Track(tx, 1)
	if !c.Owed() {
		t.Fatal("not Owed with an event in flight")
	}
	tr.Commit(tx, 150, 160, time.Now())
	tr.Ack(tx, 1, nil)
	if got := c.Confirmed(); got != 100 {
		t.Fatalf("Confirmed = %s before the checkpoint is saved, want 0/64", got)
	}
	if len(w.acks) != 1 {
		t.Fatalf("%d checkpoint writes started, want 1", len(w.acks))
	}
	if !c.Owed() {
		t.Fatal("not Owed while the checkpoint is in flight")
	}
	c.Confirmed()
	if len(w.acks) != 1 {
		t.Fatal("a second write started while one is in flight")
	}
	w.answerAll()
	if got := c.Confirmed(); got != 160 {
		t.Fatalf("Confirmed = %s after the checkpoint, want 0/A0", got)
	}
	if c.Owed() {
		t.Fatal("Owed after everything was confirmed")
	}

	// The next transaction is written as soon as the prompt interval has
	// passed since the last write, not after the idle interval.
	tx = tr.Begin(time.Now())
	tr.Track(tx, 1)
	tr.Commit(tx, 170, 180, time.Now())
	tr.Ack(tx, 1, nil)
	deadline := time.Now().Add(10 * time.Second)
	for len(w.acks) == 0 && time.Now().Before(deadline) {
		c.Confirmed()
		time.Sleep(time.Millisecond)
	}
	w.answerAll()
	if got := c.Confirmed(); got != 180 {
		t.Fatalf("Confirmed = %s, want 0/B4 one prompt interval later", got)
	}

	// A keepalive moves the watermark, but is not owed and waits for the
	// idle interval.
	tr.Keepalive(pglogrepl.LSN(500), time.Now())
	time.Sleep(2 * prompt) // let the prompt interval pass: it must not matter
	if got := c.Confirmed(); got != 180 || len(w.acks) != 0 || c.Owed() {
		t.Fatalf("after a keepalive: Confirmed = %s, %d writes, owed %v; want 0/B4, none, false", got, len(w.acks), c.Owed())
	}
}

// topicRecords makes checkpoint records for a topic, unsigned.
type topicRecords string

func (t topicRecords) NewRecord(rec checkpoint.Record) (*kgo.Record, error) {
	v, err := json.Marshal(rec)
	return &kgo.Record{Topic: string(t), Key: []byte(rec.Key()), Value: v}, err
}
