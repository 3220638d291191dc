package delivery

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/errtext"
)

// Exactly-once delivery (docs/design.md, "Exactly-once"). The
// producer is transactional, with an id fixed by the slot and the database
// system. A Kafka transaction holds whole Postgres transactions and, last,
// the checkpoint record of the end of the last of them; it is committed at
// a Postgres transaction boundary once it holds commit_events events or
// has been open commit_interval, and only then is the slot confirmed. On
// start the checkpoint is read read_committed, and every Postgres
// transaction whose commit LSN it covers is skipped: what a committed Kafka
// transaction holds is never sent again, and what an aborted or unfinished
// one held is invisible to read_committed consumers and sent again. A second
// instance with the same id fences the first, whose next produce or commit
// fails: it stops without committing.

// Transactions is the transactional producer a Committer commits through
// (sink.Kafka with a transactional id).
type Transactions interface {
	BeginTxn() error
	FlushTxn(ctx context.Context) error
	CommitTxn(ctx context.Context) error
	AbortTxn(ctx context.Context) error
	Produce(r *kgo.Record, done func(error))
	TransactionTimeout() time.Duration
}

// TransactionalID is the producer's transactional id: one per slot and
// database system, the same across restarts and replicas, so that a second
// instance fences the first.
func TransactionalID(slot, systemID string) string {
	return "outbox-cdc." + slot + "." + systemID
}

// FenceRecord is the record a new holder of the transactional id commits
// to the checkpoint topic to fence the last one: its key, beside the
// checkpoint's, and who took over, for the operator.
func FenceRecord(slot, systemID string) (key string, value []byte) {
	host, _ := os.Hostname()
	value, _ = json.Marshal(map[string]any{"host": host, "pid": os.Getpid(), "at": time.Now().UTC()})
	return checkpoint.Key(slot, systemID) + "/fence", value
}

// Committer is how a session confirms in exactly-once mode (it implements
// wal.Acks, as Confirmer does at least once): the position it reports is
// the one a committed Kafka transaction's checkpoint covers. It starts a
// Kafka transaction before a Postgres transaction's first event (Begin),
// and commits it, with the checkpoint last, at a Postgres transaction
// boundary (Confirmed).
type Committer struct {
	pgTxn    func() bool // the stream is inside a Postgres transaction
	k        Transactions
	tr       *Tracker
	progress *Progress
	store    Records
	events   int           // commit_events
	interval time.Duration // commit_interval
	idle     time.Duration // a checkpoint-only transaction at most this often
	onSaved  func()

	mu         sync.Mutex
	open       bool // a Kafka transaction is open
	began      time.Time
	inTxn      int // events in it
	committing bool
	confirmed  pglogrepl.LSN
	last       time.Time // the last commit
	err        error
	halted     bool // the loop ended: Confirmed starts no more commits
	soon       bool // commit at the next Postgres transaction boundary (Soon)
}

// Halt stops Confirmed from starting commits once the replication loop
// has ended: shutdown commits through Final, and a failed session leaves
// what is open to the next one's fence.
func (c *Committer) Halt() {
	c.mu.Lock()
	c.halted = true
	c.mu.Unlock()
}

// NewCommitter commits k's transactions with checkpoints of tr's
// position to store's topic: once one holds events events or has been
// open interval, at the next Postgres transaction boundary; a position
// moved by keepalives alone at most once every idle interval. inTxn
// reports whether the stream is inside a Postgres transaction; only the
// stream's goroutine calls Confirmed, which reads it.
func NewCommitter(k Transactions, tr *Tracker, progress *Progress, store Records, inTxn func() bool, events int, interval, idle time.Duration) *Committer {
	return &Committer{pgTxn: inTxn, k: k, tr: tr, progress: progress, store: store,
		events: events, interval: interval, idle: idle,
		confirmed: progress.Saved().Confirmed, last: time.Now()}
}

// OnSaved sets a function called after each committed checkpoint; it
// must not block. Call it before use.
func (c *Committer) OnSaved(f func()) { c.onSaved = f }

// Begin opens a Kafka transaction if none is: the session calls it before
// producing. Only the stream's goroutine calls it, and never while a commit
// runs (the loop does not read then).
func (c *Committer) Begin() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.open {
		return nil
	}
	if err := c.k.BeginTxn(); err != nil {
		return err
	}
	c.open, c.began, c.inTxn = true, time.Now(), 0
	return nil
}

// Produced counts one event in the open transaction.
func (c *Committer) Produced() {
	c.mu.Lock()
	c.inTxn++
	c.mu.Unlock()
}

// Soon makes the open Kafka transaction due for commit at the next
// Postgres transaction boundary, whatever it holds: a key parked anew is
// then in the checkpoint within a transaction, so that an operator who
// sees the connector stop on a later event finds it there to redrive.
func (c *Committer) Soon() {
	c.mu.Lock()
	c.soon = true
	c.mu.Unlock()
}

// Confirmed starts a commit when one is due and the stream is between
// Postgres transactions, and returns the position the last committed
// checkpoint covers.
func (c *Committer) Confirmed() pglogrepl.LSN {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.committing && !c.halted && c.err == nil && !c.pgTxn() {
		now := time.Now()
		due := c.open && (c.soon || commitDue(c.inTxn, now.Sub(c.began), c.tr.Lag(now), c.events, c.interval, c.k.TransactionTimeout()))
		// A position moved by keepalives alone (a quiet outbox in a busy
		// database) is checkpointed now and then, in a transaction of
		// its own.
		idle := !c.open && c.tr.Idle() && c.tr.Position().LSN > c.confirmed && now.Sub(c.last) >= c.idle
		if due || idle {
			c.committing = true
			go c.commit()
		}
	}
	return c.confirmed
}

// A reader whose newest transaction committed more than catchUpAge ago
// (Tracker.Lag) is catching up, and commits fewer Kafka transactions:
// catchUpScale times the events, and catchUpScale times the interval up to
// catchUpInterval (and half the transaction timeout; never less than
// commit_interval). Each commit pauses the stream (Saturated) while the
// producer flushes and EndTxn runs, a round trip or more to the broker:
// in a drain they are most of what exactly-once costs over at-least-once
// (docs/benchmarks.md). A
// read_committed consumer's latency is the backlog's age then anyway,
// already past a second. Lag, not Behind: the oldest unresolved
// transaction's age drops to 0 whenever the acks catch up with the reader
// for a moment, and a commit then came early.
const (
	catchUpAge      = time.Second
	catchUpScale    = 10
	catchUpInterval = time.Second
)

// commitDue is whether a Kafka transaction holding events events, open
// for open, is due for commit at the next Postgres transaction boundary,
// given commit_events, commit_interval, the transaction timeout and how
// far behind Postgres the reader is (Tracker.Lag).
func commitDue(events int, open, lag time.Duration, maxEvents int, interval, timeout time.Duration) bool {
	if lag > catchUpAge {
		maxEvents = catchUpScale * maxEvents
		interval = max(interval, min(catchUpScale*interval, catchUpInterval, timeout/2))
	}
	return events >= maxEvents || open >= interval
}

// commit writes the checkpoint into the transaction and commits it. The
// loop does not read while it runs (Saturated).
func (c *Committer) commit() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*c.k.TransactionTimeout())
	defer cancel()
	err := c.CommitNow(ctx, nil)
	c.mu.Lock()
	c.committing = false
	if limit := c.k.TransactionTimeout(); err != nil && !c.began.IsZero() && time.Since(c.began) >= limit {
		// Sent again, the same Postgres transactions would take as long
		// again: say what to change rather than retry forever.
		err = &TxnTimeoutError{Limit: limit, Open: time.Since(c.began), Err: err}
	}
	if err != nil && c.err == nil {
		c.err = err
	}
	c.mu.Unlock()
	c.tr.Notify()
}

// CommitNow commits the open transaction (opening one when only the
// position moved) with the checkpoint of the tracker's position once every
// event in it is acknowledged; edit, if set, changes that checkpoint first.
func (c *Committer) CommitNow(ctx context.Context, edit func(*checkpoint.Record)) error {
	c.mu.Lock()
	open := c.open
	if !open {
		// A checkpoint-only transaction opens now: a failure of it is
		// not one that outlived transaction_timeout (commit reads began).
		c.began = time.Now()
	}
	c.mu.Unlock()
	if !open {
		if err := c.k.BeginTxn(); err != nil {
			return err
		}
	} else if err := c.k.FlushTxn(ctx); err != nil {
		return err
	}
	if err := c.tr.Err(); err != nil {
		return err
	}
	rec := c.progress.Next(c.tr.Position(), time.Now())
	if edit != nil {
		edit(&rec)
	}
	kr, err := c.store.NewRecord(rec)
	if err != nil {
		return err
	}
	var produceErr error
	var wg sync.WaitGroup
	wg.Add(1)
	c.k.Produce(kr, func(err error) { produceErr = err; wg.Done() })
	if err := c.k.CommitTxn(ctx); err != nil {
		return err
	}
	wg.Wait()
	if produceErr != nil {
		return produceErr
	}
	c.progress.Store(rec)
	c.mu.Lock()
	c.open, c.inTxn, c.confirmed, c.last, c.soon = false, 0, rec.Confirmed, time.Now(), false
	c.mu.Unlock()
	if c.onSaved != nil {
		c.onSaved()
	}
	return nil
}

// Final commits what is open if the stream stopped between Postgres
// transactions, or aborts it if one was open (its events are sent again,
// whole, by the next start). Shutdown calls it.
func (c *Committer) Final(ctx context.Context) error {
	for {
		c.mu.Lock()
		committing, open, err := c.committing, c.open, c.err
		c.mu.Unlock()
		if err != nil {
			return err
		}
		if !committing {
			if !open {
				return nil
			}
			if c.pgTxn() {
				return c.k.AbortTxn(ctx)
			}
			c.mu.Lock()
			c.committing = true
			c.mu.Unlock()
			err := c.CommitNow(ctx, nil)
			c.mu.Lock()
			c.committing = false
			c.mu.Unlock()
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-c.tr.Changed():
		}
	}
}

// Keepalive passes a keepalive on to the tracker.
func (c *Committer) Keepalive(walEnd pglogrepl.LSN, at time.Time) { c.tr.Keepalive(walEnd, at) }

// Saturated stops the loop while a commit runs, and while too much is in
// flight.
func (c *Committer) Saturated() bool {
	c.mu.Lock()
	committing := c.committing
	c.mu.Unlock()
	return committing || c.tr.Saturated()
}

// Changed fires when the tracker's state or a commit changed.
func (c *Committer) Changed() <-chan struct{} { return c.tr.Changed() }

// Err is a failed commit or delivery.
func (c *Committer) Err() error {
	c.mu.Lock()
	err := c.err
	c.mu.Unlock()
	if err != nil {
		return err
	}
	return c.tr.Err()
}

// Owed: a transaction is open or committing, or the position moved past
// the last commit.
func (c *Committer) Owed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.open || c.committing || c.tr.Position().LSN > c.confirmed
}

// TxnTimeoutError says a Kafka transaction was open longer than the
// transaction timeout, so the broker aborted it: the Postgres transactions
// in it (one too large, or Kafka too slow) take too long to send. Nothing
// of it was committed or confirmed, so nothing is lost; it stops the
// connector, since the same transactions would fail the same way.
type TxnTimeoutError struct {
	Limit, Open time.Duration
	Err         error
}

func (e *TxnTimeoutError) Error() string {
	return fmt.Sprintf("the Kafka transaction was open %s, longer than exactly_once.transaction_timeout (%s), and the broker aborted it (%s); a Postgres transaction too large to send in that time, or a slow broker: raise exactly_once.transaction_timeout (up to the brokers' transaction.max.timeout.ms) and restart; nothing was committed or confirmed, so nothing is lost",
		e.Open.Round(time.Second), e.Limit, errtext.OneLine(e.Err))
}
