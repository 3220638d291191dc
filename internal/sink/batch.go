package sink

import (
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// The event path batches adaptively by pacing: a record goes to the
// producer at once when no batch went in the last MaxBatchDelay, and
// otherwise waits, with whatever else arrives, until MaxBatchDelay after
// the last batch. An idle stream (events further apart than the delay)
// therefore sends each event as soon as it is decoded, and a busy one sends
// at most one batch per MaxBatchDelay, so the number of requests follows
// the delay rather than the event rate. Sending each event alone under load
// costs a wake-up, a request and an answer per event in the connector and
// in the broker, and on a small machine that cost alone can put the
// connector seconds behind (docs/design.md, "Batching").
//
// A live stream (Live) batches by its reads instead: Send holds every
// record, and the stream calls Drained once it has handled all that its
// reads brought, before it waits for more. Each batch is then what
// arrived in one wait, sent as soon as it is decoded, and the stream's next
// read waits for the time Drained returns, so that batches stay
// MaxBatchDelay apart and the reads and the batches share one wake-up.

type heldRecord struct {
	rec  *kgo.Record
	done func(error)
}

// batcher is Send's state. Send, Release and Flush are called from one
// goroutine, the replication loop's, so it needs no lock; that one
// goroutine is also what keeps records in the order they were sent.
type batcher struct {
	held  []heldRecord
	last  time.Time // when the last batch went
	first time.Time // when the first of held was held
	live  bool      // Send holds every record for Drained
	now   func() time.Time
	// delay is the least time between two batches (Config.batchDelay);
	// 0: every record goes at once.
	delay time.Duration
}

// Send produces rec, at once or with the next batch (see above); done is
// called with Kafka's answer.
func (k *Kafka) Send(rec *kgo.Record, done func(error)) {
	b := &k.batch
	if b.delay == 0 {
		k.Produce(rec, done)
		return
	}
	if len(b.held) == 0 {
		now := b.now()
		if !b.live && now.Sub(b.last) >= b.delay {
			b.last = now
			k.Produce(rec, done)
			return
		}
		b.first = now
	}
	b.held = append(b.held, heldRecord{rec, done})
}

// Release sends the held records if their batch is due as of now (the zero
// time: at once). It returns when it must be called again, or the zero
// time when nothing is held. A live stream's batch is due MaxBatchDelay
// after its first record was held, not after the last batch: the stream
// calls Release after every message, and the batch is Drained's to send
// once the read is decoded, so Release only bounds the wait of a batch
// whose reads keep filling the buffer and never drain the socket.
func (k *Kafka) Release(now time.Time) time.Time {
	b := &k.batch
	if len(b.held) == 0 {
		return time.Time{}
	}
	due := b.last.Add(b.delay)
	if b.live {
		due = b.first.Add(b.delay)
	}
	if !now.IsZero() && now.Before(due) {
		return due
	}
	b.last = b.now()
	for i, h := range b.held {
		k.Produce(h.rec, h.done)
		b.held[i] = heldRecord{}
	}
	b.held = b.held[:0]
	return time.Time{}
}

// Live turns the live stream's batching on or off (see above).
func (k *Kafka) Live(on bool) { k.batch.live = on }

// Drained sends what Send holds, and returns the earliest time the next
// batch may go. It is the live stream's release: see above.
func (k *Kafka) Drained() time.Time {
	if k.batch.delay == 0 {
		return time.Time{}
	}
	k.Release(time.Time{})
	return k.batch.last.Add(k.batch.delay)
}

// RecordSize estimates a record's size in a batch: franz-go fails a record
// over ProducerBatchMaxBytes on its own, so checking first lets an
// oversized event take the invalid-event policy instead.
func RecordSize(r *kgo.Record) int {
	n := len(r.Key) + len(r.Value) + 128 // record and batch framing
	for _, h := range r.Headers {
		n += len(h.Key) + len(h.Value) + 8
	}
	return n
}
