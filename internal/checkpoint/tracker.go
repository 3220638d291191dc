package checkpoint

import (
	"sync"

	"github.com/jackc/pglogrepl"
)

// Txn is one Postgres transaction as the Tracker sees it. Callers hold it
// between Begin and the last Ack of its events; its fields are guarded by
// the Tracker's mutex.
type Txn struct {
	pending   int
	committed bool
	end       pglogrepl.LSN
}

// Tracker computes the confirmable watermark from out-of-order acks. It is
// safe for concurrent use: the replication loop calls Begin, Track, Commit and
// the readers; the Kafka client's promise goroutine calls Ack.
type Tracker struct {
	maxInFlight int
	changed     chan struct{}

	mu        sync.Mutex
	txns      []*Txn // open and unresolved transactions, in commit order
	inFlight  int
	acked     uint64
	confirmed pglogrepl.LSN
	err       error
}

// NewTracker returns a Tracker that reports Saturated once maxInFlight
// events are unacknowledged. The watermark starts at start, normally the
// slot's confirmed_flush_lsn.
func NewTracker(start pglogrepl.LSN, maxInFlight int) *Tracker {
	if maxInFlight < 1 {
		maxInFlight = 1
	}
	return &Tracker{maxInFlight: maxInFlight, confirmed: start, changed: make(chan struct{}, 1)}
}

// Begin opens a transaction. Transactions must be begun in commit order,
// which is the order pgoutput sends them in.
func (t *Tracker) Begin() *Txn {
	tx := &Txn{}
	t.mu.Lock()
	t.txns = append(t.txns, tx)
	t.mu.Unlock()
	return tx
}

// Track records one more event of tx that is on its way to Kafka. Each
// Track must be followed by exactly one Ack.
func (t *Tracker) Track(tx *Txn) {
	t.mu.Lock()
	tx.pending++
	t.inFlight++
	t.mu.Unlock()
}

// Ack records Kafka's answer for one tracked event of tx. A non-nil err
// leaves the event pending for good: the watermark stops before tx, and Err
// returns the first such error.
func (t *Tracker) Ack(tx *Txn, err error) {
	t.mu.Lock()
	if err != nil {
		if t.err == nil {
			t.err = err
		}
		t.mu.Unlock()
		t.notify()
		return
	}
	tx.pending--
	t.inFlight--
	t.acked++
	t.resolveLocked()
	t.mu.Unlock()
	t.notify()
}

// Commit closes tx at end, the end LSN of its commit record. No Track may
// follow for tx.
func (t *Tracker) Commit(tx *Txn, end pglogrepl.LSN) {
	t.mu.Lock()
	tx.committed = true
	tx.end = end
	advanced := t.resolveLocked()
	t.mu.Unlock()
	if advanced {
		t.notify()
	}
}

// resolveLocked pops the prefix of committed transactions with nothing
// pending and moves the watermark to the last one's end.
func (t *Tracker) resolveLocked() bool {
	n := 0
	for n < len(t.txns) && t.txns[n].committed && t.txns[n].pending == 0 {
		if t.txns[n].end > t.confirmed {
			t.confirmed = t.txns[n].end
		}
		t.txns[n] = nil
		n++
	}
	if n == 0 {
		return false
	}
	t.txns = t.txns[n:]
	if len(t.txns) == 0 {
		t.txns = t.txns[:0:0] // let the backing array go
	}
	return true
}

func (t *Tracker) notify() {
	select {
	case t.changed <- struct{}{}:
	default:
	}
}

// Confirmed returns the watermark: the highest end LSN whose transaction and
// every transaction before it Kafka has fully acknowledged.
func (t *Tracker) Confirmed() pglogrepl.LSN {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.confirmed
}

// Idle reports whether no transaction is open and no event is in flight:
// only then may the slot move past the watermark to the server's WAL end.
func (t *Tracker) Idle() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.txns) == 0
}

// Saturated reports whether the number of unacknowledged events has reached
// the limit; the replication loop then stops reading until acks free room.
func (t *Tracker) Saturated() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.inFlight >= t.maxInFlight
}

// InFlight returns the number of events sent to Kafka and not yet acked.
func (t *Tracker) InFlight() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.inFlight
}

// Acked returns how many events Kafka has acknowledged so far.
func (t *Tracker) Acked() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.acked
}

// Err returns the first produce error, or nil.
func (t *Tracker) Err() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.err
}

// Changed is signalled (without blocking, coalesced) whenever an ack or a
// commit may have changed Confirmed, Saturated or Err.
func (t *Tracker) Changed() <-chan struct{} { return t.changed }
