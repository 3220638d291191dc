package delivery

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/outboxcdc/cdc/internal/checkpoint"
)

// Txn is one Postgres transaction as the Tracker sees it. Callers hold it
// between Begin and the last Ack of its events; its fields are guarded by
// the Tracker's mutex.
type Txn struct {
	pending    int
	committed  bool
	end        pglogrepl.LSN
	commitLSN  pglogrepl.LSN
	commitTime time.Time
	// notes, when set, is what checkpoints record once this transaction
	// is delivered, beside its position.
	notes *notes
}

// notes are what a transaction carries to the checkpoint (Note,
// NoteTables, NoteParked, NoteUsed). Few transactions carry any, and every
// transaction in flight has a Txn (max_in_flight of them, with 1-row
// transactions), so a Txn holds them behind one pointer.
type notes struct {
	// backfills, when set, is the backfill jobs' state once the
	// transaction is delivered; tables, the tables' relation ids.
	backfills *[]checkpoint.Job
	tables    map[string]checkpoint.Table
	parked    *[]checkpoint.Parked
	used      *[]checkpoint.Used
}

// note is tx's notes, made at the first.
func (tx *Txn) note() *notes {
	if tx.notes == nil {
		tx.notes = &notes{}
	}
	return tx.notes
}

// at sets in p what is set in n.
func (n *notes) at(p *Position) {
	if n.backfills != nil {
		p.Backfills = n.backfills
	}
	if n.tables != nil {
		p.Tables = n.tables
	}
	if n.parked != nil {
		p.Parked = n.parked
	}
	if n.used != nil {
		p.Used = n.used
	}
}

// onto sets in m what is set in n.
func (n *notes) onto(m *notes) {
	if n.backfills != nil {
		m.backfills = n.backfills
	}
	if n.tables != nil {
		m.tables = n.tables
	}
	if n.parked != nil {
		m.parked = n.parked
	}
	if n.used != nil {
		m.used = n.used
	}
}

// Position is the watermark and where it came from.
type Position struct {
	// LSN is the watermark: the highest transaction end LSN such that
	// Kafka has acknowledged every event at or before it, or a keepalive's
	// WAL end seen while nothing was open or in flight.
	LSN pglogrepl.LSN
	// Time is when the WAL had reached LSN: the commit time of the last
	// resolved transaction, or the keepalive's server time.
	Time time.Time
	// CommitLSN and CommitTime are those of the last resolved transaction
	// (zero before the first).
	CommitLSN  pglogrepl.LSN
	CommitTime time.Time
	// Backfills, when set, is the backfill jobs' state at LSN: that of the
	// last resolved transaction that carried one (Tracker.Note). Tables,
	// when set, is the tables' relation ids there (Tracker.NoteTables).
	Backfills *[]checkpoint.Job
	Tables    map[string]checkpoint.Table
	// Parked, when set, is the parked keys there (Tracker.NoteParked);
	// Used, the operator's requests taken (Tracker.NoteUsed).
	Parked *[]checkpoint.Parked
	Used   *[]checkpoint.Used
}

// Tracker computes the confirmable watermark from out-of-order acks. It is
// safe for concurrent use: the replication loop calls Begin, Track, Commit and
// the readers; the Kafka client's promise goroutine calls Ack.
//
// Its memory is bounded by what the loop may read before Saturated stops it
// (docs/design.md, "Memory is bounded in bytes"): events in flight, by count
// and by bytes, and unresolved transactions, by count. A transaction with
// nothing left in flight that commits behind an unresolved one is folded into
// it, so the transactions of other tables (PostgreSQL 14 sends their BEGIN and
// COMMIT) and logical messages of other prefixes do not pile up while Kafka is
// down.
type Tracker struct {
	maxInFlight int
	maxBytes    int64
	changed     chan struct{}

	mu            sync.Mutex
	txns          []*Txn // open and unresolved transactions, in commit order
	inFlight      int
	inFlightBytes int64
	acked         uint64
	pos           Position
	err           error
	// atEnd: a keepalive came after the newest transaction began. A
	// walsender sends one when it has sent all the WAL there is and the
	// client has not confirmed it all, so the reader is not behind.
	atEnd bool
}

// NewTracker returns a Tracker that reports Saturated once maxInFlight
// events, or as many unresolved transactions, are unacknowledged. The
// watermark starts at start, normally the slot's confirmed_flush_lsn.
func NewTracker(start pglogrepl.LSN, maxInFlight int) *Tracker {
	if maxInFlight < 1 {
		maxInFlight = 1
	}
	return &Tracker{maxInFlight: maxInFlight, pos: Position{LSN: start}, changed: make(chan struct{}, 1)}
}

// LimitBytes makes Saturated also report once the events in flight add up
// to n bytes (as Track counts them); 0: no limit. One event is always
// allowed, however large. Call it before use.
func (t *Tracker) LimitBytes(n int64) { t.maxBytes = n }

// Begin opens a transaction that committed at commitTime (pgoutput's
// Begin.CommitTime). Transactions must be begun in commit order, which is
// the order pgoutput sends them in.
func (t *Tracker) Begin(commitTime time.Time) *Txn {
	tx := &Txn{commitTime: commitTime}
	t.mu.Lock()
	t.txns = append(t.txns, tx)
	t.atEnd = false
	t.mu.Unlock()
	return tx
}

// Track records one more event of tx, of size bytes, that is on its way to
// Kafka. Each Track must be followed by exactly one Ack of the same size.
func (t *Tracker) Track(tx *Txn, size int) {
	t.mu.Lock()
	tx.pending++
	t.inFlight++
	t.inFlightBytes += int64(size)
	t.mu.Unlock()
}

// Ack records Kafka's answer for one tracked event of tx, of size bytes. A
// non-nil err leaves the event pending for good: the watermark stops
// before tx, and Err returns the first such error.
func (t *Tracker) Ack(tx *Txn, size int, err error) {
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
	t.inFlightBytes -= int64(size)
	t.acked++
	t.resolveLocked()
	t.mu.Unlock()
	t.notify()
}

// Note attaches the backfill jobs' state to tx: once tx is delivered, and
// the watermark passes it, checkpoints record jobs.
func (t *Tracker) Note(tx *Txn, jobs []checkpoint.Job) {
	t.mu.Lock()
	tx.note().backfills = &jobs
	t.mu.Unlock()
}

// NoteTables attaches what was streamed of the tables to tx (Record.Tables): once
// tx is delivered, and the watermark passes it, checkpoints record them.
// tables must not change afterwards.
func (t *Tracker) NoteTables(tx *Txn, tables map[string]checkpoint.Table) {
	t.mu.Lock()
	tx.note().tables = tables
	t.mu.Unlock()
}

// NoteParked attaches the parked keys to tx (Record.Parked): once tx is
// delivered, and the watermark passes it, checkpoints record them.
// parked must not change afterwards.
func (t *Tracker) NoteParked(tx *Txn, parked []checkpoint.Parked) {
	t.mu.Lock()
	tx.note().parked = &parked
	t.mu.Unlock()
}

// NoteUsed attaches the operator's requests taken to tx (Record.Used):
// once tx is delivered, and the watermark passes it, checkpoints record
// them. used must not change afterwards.
func (t *Tracker) NoteUsed(tx *Txn, used []checkpoint.Used) {
	t.mu.Lock()
	tx.note().used = &used
	t.mu.Unlock()
}

// Commit closes tx: commit is the LSN of its commit record (pgoutput's
// Begin.FinalLSN), end the end of that record, at the commit time. No Track
// may follow for tx.
func (t *Tracker) Commit(tx *Txn, commit, end pglogrepl.LSN, at time.Time) {
	t.mu.Lock()
	tx.committed = true
	tx.end, tx.commitLSN, tx.commitTime = end, commit, at
	advanced := t.resolveLocked()
	if n := len(t.txns); !advanced && n >= 2 && t.txns[n-1] == tx && tx.pending == 0 && t.txns[n-2].committed {
		// Nothing of tx is in flight, and it waits behind a committed
		// transaction that does not resolve yet (Kafka is slow or down):
		// fold it into that one, which then resolves to tx's end. The
		// position passes both at once, as it would have one after the
		// other, and the list stays as long as what is in flight.
		prev := t.txns[n-2]
		prev.end, prev.commitLSN, prev.commitTime = tx.end, tx.commitLSN, tx.commitTime
		if tx.notes != nil {
			tx.notes.onto(prev.note())
		}
		t.txns[n-1] = nil
		t.txns = t.txns[:n-1]
	}
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
		if tx := t.txns[n]; tx.end > t.pos.LSN {
			t.pos = Position{LSN: tx.end, Time: tx.commitTime, CommitLSN: tx.commitLSN, CommitTime: tx.commitTime, Backfills: t.pos.Backfills, Tables: t.pos.Tables, Parked: t.pos.Parked, Used: t.pos.Used}
		}
		if nt := t.txns[n].notes; nt != nil {
			nt.at(&t.pos)
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

// Keepalive takes a keepalive's WAL end: every message before it was handled,
// so when no transaction is open or in flight nothing up to walEnd is owed to
// Kafka, and the watermark moves there. A quiet outbox in a busy database then
// does not retain WAL (docs/design.md, "Idle slot, busy database"). Never while
// a transaction is open or in flight: that would confirm past it.
func (t *Tracker) Keepalive(walEnd pglogrepl.LSN, at time.Time) {
	t.mu.Lock()
	t.atEnd = true
	moved := len(t.txns) == 0 && walEnd > t.pos.LSN
	if moved {
		t.pos.LSN, t.pos.Time = walEnd, at
	}
	t.mu.Unlock()
	if moved {
		t.notify()
	}
}

// Notify signals Changed: for what wraps the Tracker and changes what the
// replication loop reads.
func (t *Tracker) Notify() { t.notify() }

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
	return t.pos.LSN
}

// Position returns the watermark with its time and last commit.
func (t *Tracker) Position() Position {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.pos
}

// Idle reports whether no transaction is open and no event is in flight:
// only then may the slot move past the watermark to the server's WAL end.
func (t *Tracker) Idle() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.txns) == 0
}

// Owed reports whether a transaction is open or in flight: what the
// replication loop waits on to confirm promptly.
func (t *Tracker) Owed() bool { return !t.Idle() }

// Saturated reports whether the unacknowledged events have reached the
// limit, in number or in bytes, or the unresolved transactions in number;
// the replication loop then stops reading until acks free room.
func (t *Tracker) Saturated() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.inFlight >= t.maxInFlight || len(t.txns) > t.maxInFlight ||
		(t.maxBytes > 0 && t.inFlight > 0 && t.inFlightBytes >= t.maxBytes)
}

// InFlightBytes returns the size of the events sent to Kafka and not yet
// acked, as Track counted them.
func (t *Tracker) InFlightBytes() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.inFlightBytes
}

// Behind returns the age of the oldest transaction not yet resolved (its
// commit time to now), or 0 when every transaction is.
func (t *Tracker) Behind(now time.Time) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.txns) == 0 || t.txns[0].commitTime.IsZero() {
		return 0
	}
	return max(now.Sub(t.txns[0].commitTime), 0)
}

// Lag returns how far behind Postgres the reader is: the age of the
// newest transaction read or, when every transaction is resolved, of the
// watermark (its commit, or a keepalive's server time); 0 when unknown, and
// 0 once a keepalive has come after the newest transaction (the walsender
// had no more to send). Unlike Behind it does not drop to 0 when the acks
// momentarily catch up with the reader in the middle of a backlog.
func (t *Tracker) Lag(now time.Time) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.atEnd {
		return 0
	}
	at := t.pos.Time
	if n := len(t.txns); n > 0 && !t.txns[n-1].commitTime.IsZero() {
		at = t.txns[n-1].commitTime
	}
	if at.IsZero() {
		return 0
	}
	return max(now.Sub(at), 0)
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

// WaitInFlight waits until at most n events are unacknowledged; it
// returns early on a failed delivery or when ctx ends.
func (t *Tracker) WaitInFlight(ctx context.Context, n int) error {
	return t.WaitRoom(ctx, n, -1)
}

// WaitRoom waits until at most n events, of at most bytes bytes (-1: any),
// are unacknowledged: room for what the caller is about to read. It
// returns early on a failed delivery or when ctx ends.
func (t *Tracker) WaitRoom(ctx context.Context, n int, bytes int64) error {
	for {
		if err := t.Err(); err != nil {
			return err
		}
		t.mu.Lock()
		room := t.inFlight <= n && (bytes < 0 || t.inFlightBytes <= bytes)
		t.mu.Unlock()
		if room {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.Changed():
		}
	}
}
