package delivery

import (
	"errors"
	"math/rand"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
)

func TestTrackerOutOfOrderAcks(t *testing.T) {
	tr := NewTracker(100, 1000)
	// tx1 has events on two partitions; tx2 one event; tx3 is empty.
	tx1 := tr.Begin(time.Time{})
	tr.Track(tx1, 1)
	tr.Track(tx1, 1)
	tr.Commit(tx1, 200-1, 200, time.Time{})
	tx2 := tr.Begin(time.Time{})
	tr.Track(tx2, 1)
	tr.Commit(tx2, 300-1, 300, time.Time{})
	tx3 := tr.Begin(time.Time{})
	tr.Commit(tx3, 400-1, 400, time.Time{})

	steps := []struct {
		ack  *Txn
		want pglogrepl.LSN
	}{
		{tx2, 100}, // tx2 fully acked, but tx1 is not: no advance
		{tx1, 100}, // one of tx1's two events
		{tx1, 400}, // tx1 done: tx2 and the empty tx3 resolve with it
	}
	for i, s := range steps {
		tr.Ack(s.ack, 1, nil)
		if got := tr.Confirmed(); got != s.want {
			t.Fatalf("step %d: Confirmed() = %s, want %s", i, got, s.want)
		}
	}
	if !tr.Idle() || tr.InFlight() != 0 {
		t.Fatalf("Idle() = %v, InFlight() = %d after all acks", tr.Idle(), tr.InFlight())
	}
}

func TestTrackerFailedProduceNeverAdvances(t *testing.T) {
	tr := NewTracker(0, 1000)
	tx1 := tr.Begin(time.Time{})
	tr.Track(tx1, 1)
	tr.Commit(tx1, 10-1, 10, time.Time{})
	tx2 := tr.Begin(time.Time{})
	tr.Track(tx2, 1)
	tr.Track(tx2, 1)
	tr.Commit(tx2, 20-1, 20, time.Time{})
	tx3 := tr.Begin(time.Time{})
	tr.Track(tx3, 1)
	tr.Commit(tx3, 30-1, 30, time.Time{})

	boom := errors.New("MESSAGE_TOO_LARGE")
	tr.Ack(tx1, 1, nil)
	tr.Ack(tx2, 1, boom)
	tr.Ack(tx2, 1, nil)
	tr.Ack(tx3, 1, nil)
	if got := tr.Confirmed(); got != 10 {
		t.Fatalf("Confirmed() = %s, want 0/A: the failed transaction must hold the watermark", got)
	}
	if !errors.Is(tr.Err(), boom) {
		t.Fatalf("Err() = %v, want %v", tr.Err(), boom)
	}
	if tr.Idle() {
		t.Fatal("Idle() with a failed transaction pending: the slot could skip it")
	}
	select {
	case <-tr.Changed():
	default:
		t.Fatal("no Changed signal after a failure")
	}
}

func TestTrackerEmptyTransactionsResolveImmediately(t *testing.T) {
	tr := NewTracker(5, 10)
	for _, end := range []pglogrepl.LSN{10, 20, 30} {
		tx := tr.Begin(time.Time{})
		if tr.Idle() {
			t.Fatal("Idle() while a transaction is open")
		}
		tr.Commit(tx, end-1, end, time.Time{})
		if got := tr.Confirmed(); got != end {
			t.Fatalf("Confirmed() = %s, want %s", got, end)
		}
	}
	if !tr.Idle() {
		t.Fatal("not Idle() after empty transactions")
	}
}

func TestTrackerOpenTransactionHoldsWatermark(t *testing.T) {
	tr := NewTracker(0, 10)
	tx := tr.Begin(time.Time{})
	tr.Track(tx, 1)
	tr.Ack(tx, 1, nil) // acked before its COMMIT arrived
	if got := tr.Confirmed(); got != 0 {
		t.Fatalf("Confirmed() = %s before COMMIT", got)
	}
	tr.Commit(tx, 50-1, 50, time.Time{})
	if got := tr.Confirmed(); got != 50 {
		t.Fatalf("Confirmed() = %s, want 0/32", got)
	}
}

func TestTrackerSaturated(t *testing.T) {
	tr := NewTracker(0, 2)
	tx := tr.Begin(time.Time{})
	tr.Track(tx, 1)
	if tr.Saturated() {
		t.Fatal("saturated at 1 of 2")
	}
	tr.Track(tx, 1)
	if !tr.Saturated() {
		t.Fatal("not saturated at 2 of 2")
	}
	tr.Ack(tx, 1, nil)
	if tr.Saturated() {
		t.Fatal("still saturated after an ack")
	}
}

// TestTrackerConcurrentAcks acks a random interleaving from 8 goroutines,
// as franz-go's promises do across partitions, while another goroutine
// reads the watermark the way the replication loop does. Nothing but the
// Tracker's own lock orders them, so -race checks its locking, and the
// reader checks that the watermark never covers a transaction with an
// event whose Ack has not begun, and never goes back.
func TestTrackerConcurrentAcks(t *testing.T) {
	const txns = 2000
	tr := NewTracker(0, txns*4)
	type ev struct{ tx int }
	var evs []ev
	txs := make([]*Txn, txns)
	events := make([]int64, txns)          // events per transaction
	ackBegun := make([]atomic.Int64, txns) // Acks started per transaction
	for i := range txs {
		txs[i] = tr.Begin(time.Time{})
		n := rand.Intn(4) // 0..3 events; 0 is an empty transaction
		for j := 0; j < n; j++ {
			tr.Track(txs[i], 1)
			evs = append(evs, ev{i})
		}
		events[i] = int64(n)
		tr.Commit(txs[i], pglogrepl.LSN((i+1)*10-1), pglogrepl.LSN((i+1)*10), time.Time{})
	}
	rand.Shuffle(len(evs), func(i, j int) { evs[i], evs[j] = evs[j], evs[i] })

	var acking sync.WaitGroup
	for w := 0; w < 8; w++ {
		acking.Add(1)
		go func(w int) {
			defer acking.Done()
			for i := w; i < len(evs); i += 8 {
				ackBegun[evs[i].tx].Add(1)
				tr.Ack(txs[evs[i].tx], 1, nil)
			}
		}(w)
	}
	stop := make(chan struct{})
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		var last pglogrepl.LSN
		for {
			c := tr.Confirmed()
			if c < last {
				t.Errorf("watermark went back from %s to %s", last, c)
			}
			last = c
			for k := 0; k < txns && pglogrepl.LSN((k+1)*10) <= c; k++ {
				if ackBegun[k].Load() != events[k] {
					t.Errorf("watermark %s covers tx %d, which has %d of %d events acked", c, k, ackBegun[k].Load(), events[k])
					return
				}
			}
			select {
			case <-stop:
				return
			case <-tr.Changed():
			}
		}
	}()
	acking.Wait()
	close(stop)
	<-readerDone
	if got := tr.Confirmed(); got != txns*10 {
		t.Fatalf("final Confirmed() = %s, want %s", got, pglogrepl.LSN(txns*10))
	}
	if tr.InFlight() != 0 || !tr.Idle() {
		t.Fatalf("after every ack: in flight %d, idle %v", tr.InFlight(), tr.Idle())
	}
}

// TestTrackerKeepalive: a keepalive moves the watermark to the server's WAL
// end only while nothing is open or in flight.
func TestTrackerKeepalive(t *testing.T) {
	at := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	tr := NewTracker(100, 10)
	tr.Keepalive(500, at)
	if p := tr.Position(); p.LSN != 500 || !p.Time.Equal(at) {
		t.Fatalf("idle keepalive: position %+v, want 0/1F4 at %s", p, at)
	}
	tx := tr.Begin(time.Time{}) // open, nothing tracked yet
	tr.Keepalive(600, at)
	if got := tr.Confirmed(); got != 500 {
		t.Fatalf("keepalive with a transaction open moved the watermark to %s", got)
	}
	tr.Track(tx, 1)
	tr.Commit(tx, 650, 700, at.Add(time.Second))
	tr.Keepalive(800, at) // committed but in flight
	if got := tr.Confirmed(); got != 500 {
		t.Fatalf("keepalive with an event in flight moved the watermark to %s", got)
	}
	tr.Ack(tx, 1, nil)
	if p := tr.Position(); p.LSN != 700 || p.CommitLSN != 650 || !p.CommitTime.Equal(at.Add(time.Second)) {
		t.Fatalf("after the ack: %+v, want the transaction's end 0/2BC, commit 0/28A", p)
	}
	tr.Keepalive(800, at.Add(2*time.Second))
	if p := tr.Position(); p.LSN != 800 || p.CommitLSN != 650 {
		t.Fatalf("idle again: %+v, want 0/320 with the last commit kept", p)
	}
}

// TestTrackerFoldsEmptyTransactions (issue 23, item 9): while an event is
// in flight, the transactions of other tables (PostgreSQL 14 sends their
// BEGIN and COMMIT) and other prefixes' messages do not pile up: each folds
// into the one before it, and the watermark reaches the last once the
// event is acked.
func TestTrackerFoldsEmptyTransactions(t *testing.T) {
	tr := NewTracker(0, 100)
	tx := tr.Begin(time.Time{})
	tr.Track(tx, 10)
	tr.Commit(tx, 10, 11, time.Time{})
	for i := 0; i < 100_000; i++ {
		e := tr.Begin(time.Time{})
		lsn := pglogrepl.LSN(20 + 2*i)
		tr.Commit(e, lsn, lsn+1, time.Time{})
	}
	if n := len(tr.txns); n > 2 || tr.Saturated() {
		t.Fatalf("%d transactions kept, saturated %v; want them folded into one", n, tr.Saturated())
	}
	tr.Ack(tx, 10, nil)
	if got, want := tr.Confirmed(), pglogrepl.LSN(20+2*99_999+1); got != want {
		t.Fatalf("watermark %s after the ack, want %s (the last empty transaction's end)", got, want)
	}
	if pos := tr.Position(); pos.CommitLSN != 20+2*99_999 {
		t.Errorf("last commit %s, want the last transaction's", pos.CommitLSN)
	}
}

// TestTrackerTransactionsSaturate: transactions whose events were acked
// but that wait behind one that was not (another partition stalled) count
// against the limit too.
func TestTrackerTransactionsSaturate(t *testing.T) {
	tr := NewTracker(0, 10)
	stuck := tr.Begin(time.Time{})
	tr.Track(stuck, 1)
	tr.Commit(stuck, 1, 2, time.Time{})
	for i := 0; i < 10; i++ {
		tx := tr.Begin(time.Time{})
		tr.Track(tx, 1)
		tr.Commit(tx, pglogrepl.LSN(10+2*i), pglogrepl.LSN(11+2*i), time.Time{})
		tr.Ack(tx, 1, nil)
	}
	if !tr.Saturated() {
		t.Fatalf("%d unresolved transactions and not saturated", len(tr.txns))
	}
	tr.Ack(stuck, 1, nil)
	if tr.Saturated() || tr.Confirmed() != 29 {
		t.Fatalf("after the stuck ack: saturated %v, watermark %s; want free and 0/1D", tr.Saturated(), tr.Confirmed())
	}
}

// TestTrackerBytes (issue 23, item 4): events in flight saturate by bytes
// as well as by count; one event is let through however large.
func TestTrackerBytes(t *testing.T) {
	tr := NewTracker(0, 4096)
	tr.LimitBytes(1_000_000)
	tx := tr.Begin(time.Time{})
	for i := 0; i < 3; i++ {
		if tr.Saturated() {
			t.Fatalf("saturated after %d events of 250 KB", i)
		}
		tr.Track(tx, 250_000)
	}
	tr.Track(tx, 250_000)
	if !tr.Saturated() || tr.InFlightBytes() != 1_000_000 {
		t.Fatalf("4 events of 250 KB (%d bytes): saturated %v; want saturated at 1 MB", tr.InFlightBytes(), tr.Saturated())
	}
	for i := 0; i < 4; i++ {
		tr.Ack(tx, 250_000, nil)
	}
	if tr.Saturated() || tr.InFlightBytes() != 0 {
		t.Fatalf("all acked: saturated %v, %d bytes", tr.Saturated(), tr.InFlightBytes())
	}
	huge := tr.Begin(time.Time{})
	if tr.Saturated() {
		t.Fatal("saturated before a huge event")
	}
	tr.Track(huge, 10<<20)
	if !tr.Saturated() {
		t.Fatal("a 10 MiB event in flight does not saturate")
	}
}

// TestTrackerLag: Lag is the age of the newest transaction read, and stays
// so when the acks catch up with the reader in the middle of a backlog
// (Behind then drops to 0); once all is resolved it is the last commit's
// age. A keepalive after the newest transaction (the walsender had no more
// to send) makes it 0 until the next transaction begins.
func TestTrackerLag(t *testing.T) {
	t0 := time.Date(2026, 11, 25, 10, 0, 0, 0, time.UTC)
	now := t0.Add(10 * time.Second)
	tr := NewTracker(100, 10)
	if got := tr.Lag(now); got != 0 {
		t.Fatalf("nothing read: Lag = %s, want 0", got)
	}
	old := tr.Begin(t0)
	tr.Track(old, 1)
	tr.Commit(old, 150, 200, t0)
	newer := tr.Begin(t0.Add(3 * time.Second))
	tr.Track(newer, 1)
	if got, want := tr.Lag(now), 7*time.Second; got != want {
		t.Fatalf("two transactions in flight: Lag = %s, want the newest's age %s", got, want)
	}
	if got, want := tr.Behind(now), 10*time.Second; got != want {
		t.Fatalf("Behind = %s, want the oldest's age %s", got, want)
	}
	tr.Commit(newer, 250, 300, t0.Add(3*time.Second))
	tr.Ack(old, 1, nil)
	tr.Ack(newer, 1, nil)
	if tr.Behind(now) != 0 {
		t.Fatalf("all acked: Behind = %s, want 0", tr.Behind(now))
	}
	if got, want := tr.Lag(now), 7*time.Second; got != want {
		t.Fatalf("all acked mid-backlog: Lag = %s, want the last commit's age %s", got, want)
	}
	tr.Keepalive(400, now.Add(-5*time.Millisecond))
	if got := tr.Lag(now); got != 0 {
		t.Fatalf("after a keepalive: Lag = %s, want 0", got)
	}
	next := tr.Begin(t0.Add(4 * time.Second))
	if got, want := tr.Lag(now), 6*time.Second; got != want {
		t.Fatalf("a transaction after the keepalive: Lag = %s, want its age %s", got, want)
	}
	tr.Keepalive(500, now) // while next is open
	if got := tr.Lag(now); got != 0 {
		t.Fatalf("a keepalive with a transaction open: Lag = %s, want 0", got)
	}
	tr.Commit(next, 550, 600, t0.Add(4*time.Second))
}
