package sink

import (
	"context"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// The event path batches adaptively, in the manner of Nagle's algorithm: a
// record goes to the producer at once when nothing sent before it is
// waiting for Kafka, and otherwise waits until everything sent before it
// has been answered, or until it has waited MaxBatchDelay. An idle stream
// therefore sends each event as soon as it is decoded, and a busy one sends
// what piled up during a round trip as one request, so that the number of
// requests follows the broker's pace rather than the event rate. Sending
// each event alone under load costs a wake-up, a request and an answer per
// event, and on a small machine that cost alone can put the connector
// seconds behind (docs/design.md, "Batching").

type heldRecord struct {
	rec  *kgo.Record
	done func(error)
}

// batcher is the state Send, Release and the acks share.
type batcher struct {
	mu          sync.Mutex
	held        []heldRecord
	since       time.Time // when the oldest held record arrived
	outstanding int       // records sent and not answered yet
	wake        func()    // tells the sending goroutine to call Release
}

// SetWake sets the function an ack calls when held records may go: the
// replication loop's wake-up. Call it before the first Send.
func (k *Kafka) SetWake(f func()) { k.batch.wake = f }

// Send produces rec, holding it back while earlier records are in flight
// (see above); done is called with Kafka's answer. Send and Release must be
// called from one goroutine, the replication loop's, which is what keeps
// records in the order they were sent.
func (k *Kafka) Send(rec *kgo.Record, done func(error)) {
	b := &k.batch
	b.mu.Lock()
	if k.cfg.MaxBatchDelay < 0 || (b.outstanding == 0 && len(b.held) == 0) {
		b.outstanding++
		b.mu.Unlock()
		k.send(rec, done)
		return
	}
	if len(b.held) == 0 {
		b.since = time.Now()
	}
	b.held = append(b.held, heldRecord{rec, done})
	release := b.outstanding == 0
	b.mu.Unlock()
	if release {
		k.Release(time.Time{})
	}
}

// Release sends the held records if they may go: everything before them
// was answered, or the oldest has waited MaxBatchDelay as of now (the zero
// time: release regardless). It returns when it must be called again if
// no ack comes first, or the zero time when nothing is held.
func (k *Kafka) Release(now time.Time) time.Time {
	b := &k.batch
	b.mu.Lock()
	if len(b.held) == 0 {
		b.mu.Unlock()
		return time.Time{}
	}
	due := b.since.Add(k.cfg.MaxBatchDelay)
	if b.outstanding > 0 && !now.IsZero() && now.Before(due) {
		b.mu.Unlock()
		return due
	}
	held := b.held
	b.held = make([]heldRecord, 0, cap(held))
	b.outstanding += len(held)
	b.mu.Unlock()
	for _, h := range held {
		k.send(h.rec, h.done)
	}
	return time.Time{}
}

// send hands rec to franz-go; its answer counts down the records in flight
// and wakes the sender when held records may go.
func (k *Kafka) send(rec *kgo.Record, done func(error)) {
	// context.Background: records are never cancelled (see doc.go).
	k.cl.Produce(context.Background(), rec, func(r *kgo.Record, err error) {
		b := &k.batch
		b.mu.Lock()
		b.outstanding--
		wake := b.outstanding == 0 && len(b.held) > 0
		b.mu.Unlock()
		if wake && b.wake != nil {
			b.wake()
		}
		done(k.produceError(r, err))
	})
}
