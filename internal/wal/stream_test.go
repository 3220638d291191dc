package wal_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pglogrepl"

	"github.com/outboxcdc/cdc/internal/opt"
	"github.com/outboxcdc/cdc/internal/postgres"
	"github.com/outboxcdc/cdc/internal/testenv"
	"github.com/outboxcdc/cdc/internal/wal"
)

// movingAcks confirms whatever the test sets, and owes nothing, so the
// loop has no reason of its own to look at it before the status interval.
type movingAcks struct{ pos atomic.Uint64 }

func (a *movingAcks) Confirmed() pglogrepl.LSN         { return pglogrepl.LSN(a.pos.Load()) }
func (*movingAcks) Owed() bool                         { return false }
func (*movingAcks) Keepalive(pglogrepl.LSN, time.Time) {}
func (*movingAcks) Saturated() bool                    { return false }
func (*movingAcks) Err() error                         { return nil }
func (*movingAcks) Changed() <-chan struct{}           { return nil }

// releasingAcks is movingAcks with a producer's batching (wal.Releaser)
// that notes what the loop tells it.
type releasingAcks struct {
	movingAcks
	mu      sync.Mutex
	live    []bool
	drained atomic.Int64
}

func (*releasingAcks) Release(time.Time) time.Time { return time.Time{} }
func (a *releasingAcks) Drained() time.Time        { a.drained.Add(1); return time.Time{} }
func (a *releasingAcks) Live(on bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.live = append(a.live, on)
}

func (a *releasingAcks) lives() []bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]bool(nil), a.live...)
}

// TestWakeConfirmsAtOnce: a position that moves while the loop waits in a
// receive (a checkpoint acknowledged) is confirmed as soon as Wake is
// called, not at the next status update, here an hour away.
func TestWakeConfirmsAtOnce(t *testing.T) {
	db, c, from := slotted(t)
	c.StatusInterval, c.ConfirmInterval = time.Hour, 10*time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	s, err := wal.Open(ctx, c, from, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	acks := &movingAcks{}
	acks.pos.Store(uint64(from))
	commits := make(chan struct{}, 100)
	done := make(chan error, 1)
	go func() {
		done <- s.Run(ctx, func(_ pglogrepl.LSN, data []byte) error {
			if len(data) > 0 && data[0] == 'C' { // pgoutput's Commit
				commits <- struct{}{}
			}
			return nil
		}, acks, nil)
	}()
	defer func() {
		cancel()
		<-done
		s.Close(context.Background(), acks)
	}()

	for round := 0; round < 3; round++ {
		testenv.Exec(t, db, `INSERT INTO outbox (aggregatetype, aggregateid, type) VALUES ('a', 'b', 'c')`)
		end := testenv.CurrentWAL(t, db)
		// Let the loop take the transaction and go back to its receive.
		select {
		case <-commits:
		case err := <-done:
			t.Fatalf("Run returned %v", err)
		case <-time.After(time.Minute):
			t.Fatalf("the transaction was not streamed")
		}
		if pos := testenv.SlotPosition(t, db, "outbox_cdc"); pos >= end {
			t.Fatalf("slot at %s before the position moved", pos)
		}
		acks.pos.Store(uint64(end))
		s.Wake()
		// Any deadline well short of the status interval (an hour) tells
		// a woken loop from one that waits for its next status update.
		testenv.Eventually(t, time.Minute, "the woken loop to confirm", func() bool {
			return testenv.SlotPosition(t, db, "outbox_cdc") >= end
		})
	}
}

// TestReadBatchOnlyWhenLive (postgres.read_batch): a stream batches its
// reads while its transactions are fresh, and reads at once while it
// works through a backlog (transactions committed more than a second
// before), or when the batch time is off.
func TestReadBatchOnlyWhenLive(t *testing.T) {
	for _, batch := range []time.Duration{time.Millisecond, 0} {
		db, c, from := slotted(t)
		// A backlog, old by the time the stream reads it.
		testenv.Exec(t, db, `INSERT INTO outbox (aggregatetype, aggregateid, type) VALUES ('old', 'b', 'c')`)
		written := time.Now()
		testenv.Eventually(t, time.Minute, "the backlog to age past a second", func() bool { return time.Since(written) > 1200*time.Millisecond })

		c.ReadBatch = opt.Set(batch)
		onLive := make(chan bool, 10)
		c.OnLive = func(live bool) { onLive <- live }
		ctx, cancel := context.WithCancel(context.Background())
		s, err := wal.Open(ctx, c, from, hclog.NewNullLogger())
		if err != nil {
			t.Fatal(err)
		}
		acks := &releasingAcks{}
		next, wait := recordCommits(t, ctx, s, acks)
		if got := next(); got.agg != "old" || got.batching {
			t.Fatalf("read_batch %s: the backlog's transaction: %+v, want it read unbatched", batch, got)
		}
		// Committed as an application does: the test server's
		// synchronous_commit=off holds WAL from the walsender for up to
		// three wal_writer_delays.
		testenv.Exec(t, db, "SET synchronous_commit = on", `INSERT INTO outbox (aggregatetype, aggregateid, type) VALUES ('new', 'b', 'c')`)
		if got := next(); got.agg != "new" || got.batching != (batch > 0) {
			t.Fatalf("read_batch %s: a live transaction: %+v, want batching %v", batch, got, batch > 0)
		}
		if batch > 0 {
			// Live: the program and the producer are told, and once the
			// loop has handled the transaction and goes back to the
			// socket, the producer's batch is let go before the wait.
			select {
			case got := <-onLive:
				if !got {
					t.Fatal("OnLive(false) before the stream turned live")
				}
			default: // told on the loop's goroutine before the BEGIN was handled
				t.Fatal("the stream turned live and OnLive was not told")
			}
			testenv.Eventually(t, time.Minute, "the loop to drain the producer's batch", func() bool { return acks.drained.Load() > 0 })
		}
		cancel()
		_ = wait()
		close(onLive)
		var after []bool
		for v := range onLive {
			after = append(after, v)
		}
		if want := map[bool]string{true: "[false]", false: "[]"}[batch > 0]; fmt.Sprint(after) != want {
			t.Fatalf("read_batch %s: OnLive told %v once the live session ended, want %s", batch, after, want)
		}
		if lives := acks.lives(); batch > 0 && fmt.Sprint(lives) != "[true false]" || batch == 0 && (len(lives) > 0 || acks.drained.Load() > 0) {
			t.Fatalf("read_batch %s: the producer was told Live %v and drained %d times", batch, lives, acks.drained.Load())
		}
		s.Close(context.Background(), &movingAcks{})
		dropSlot(t, db) // for the next round
	}
}

// TestYoungBacklogReadAsBacklog (postgres.read_batch): a backlog written
// less than liveAge before the stream reads it (a restart) is read at
// once, not batched as if its transactions were arriving: the stream turns
// live only on a fresh transaction that follows a keepalive, which the
// walsender sends once it has sent all the WAL there is.
//
// A backlog read liveAge or more after it committed tells nothing (the
// old rule, live on any transaction younger than liveAge, would not have
// turned live on it either). liveAge is a second; here it is a minute, so
// that the backlog is young however long a loaded machine takes to
// connect and read it.
func TestYoungBacklogReadAsBacklog(t *testing.T) {
	const young = time.Minute
	defer wal.SetLiveAge(young)()
	if age := readYoungBacklog(t); age >= young {
		t.Fatalf("the backlog's last transaction was read %s after it committed: too old to tell a young backlog from an old one", age)
	}
}

// readYoungBacklog writes a backlog of transactions to a new database,
// streams it with read batching, and fails the test if one of them is read
// batched, or if a transaction written after it is not. It returns how
// long after the backlog was written its last transaction was read.
func readYoungBacklog(t *testing.T) time.Duration {
	t.Helper()
	db, c, from := slotted(t)
	// Flushed at once, so that the walsender has it all from the start
	// and does not wait (and send a keepalive) in the middle.
	// One connection, each insert its own transaction. The caller times
	// the youngest (the last): were it read younger than liveAge, the old
	// rule would have turned the stream live on it.
	const backlog = 20
	stmts := []string{"SET synchronous_commit = on"}
	for range backlog {
		stmts = append(stmts, `INSERT INTO outbox (aggregatetype, aggregateid, type) VALUES ('old', 'b', 'c')`)
	}
	testenv.Exec(t, db, stmts...)
	written := time.Now()
	c.ReadBatch = opt.Set(time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	s, err := wal.Open(ctx, c, from, hclog.NewNullLogger())
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	next, wait := recordCommits(t, ctx, s, &releasingAcks{})
	defer func() {
		cancel()
		_ = wait()
		s.Close(context.Background(), &movingAcks{})
		dropSlot(t, db) // for the next try
	}()
	var age time.Duration
	for i := range backlog {
		got := next()
		if got.agg != "old" || got.batching {
			t.Fatalf("the backlog's transaction %d: %+v, want it read unbatched", i, got)
		}
		age = got.at.Sub(written)
	}
	testenv.Exec(t, db, "SET synchronous_commit = on", `INSERT INTO outbox (aggregatetype, aggregateid, type) VALUES ('new', 'b', 'c')`)
	if got := next(); got.agg != "new" || !got.batching {
		t.Fatalf("a transaction after the backlog was read: %+v, want it batched (live)", got)
	}
	return age
}

// dropSlot drops the slot outbox_cdc once its walsender has let it go:
// slot names are the cluster's, and the next stream of the test, on a
// database of its own, makes it again.
func dropSlot(t *testing.T, db string) {
	t.Helper()
	testenv.Eventually(t, time.Minute, "the slot to be released", func() bool {
		var active bool
		testenv.QueryRow(t, db, `SELECT active FROM pg_replication_slots WHERE slot_name = 'outbox_cdc'`, nil, &active)
		return !active
	})
	testenv.Exec(t, db, `SELECT pg_drop_replication_slot('outbox_cdc')`)
}

// committed is one transaction a stream under recordCommits handled: whose
// insert it held ("old" or "new"), whether reads were batched when its
// COMMIT came, and when.
type committed struct {
	agg      string
	batching bool
	at       time.Time
}

// recordCommits runs s with acks until ctx ends. next waits for the next
// transaction handled, failing the test if Run returns or none comes
// within a minute; wait waits for Run to return and returns its error.
func recordCommits(t *testing.T, ctx context.Context, s *wal.Stream, acks wal.Acks) (next func() committed, wait func() error) {
	commits := make(chan committed, 100)
	finished := make(chan struct{})
	var runErr error
	go func() {
		defer close(finished)
		agg := ""
		runErr = s.Run(ctx, func(_ pglogrepl.LSN, data []byte) error {
			switch {
			case len(data) > 0 && data[0] == 'I': // pgoutput's Insert: note whose
				agg = "new"
				if strings.Contains(string(data), "old") {
					agg = "old"
				}
			case len(data) > 0 && data[0] == 'C':
				commits <- committed{agg, wal.Batching(s), time.Now()}
			}
			return nil
		}, acks, releaser(acks))
	}()
	next = func() committed {
		t.Helper()
		select {
		case c := <-commits:
			return c
		case <-finished:
			t.Fatalf("Run returned %v", runErr)
		case <-time.After(time.Minute):
			t.Fatal("no transaction streamed")
		}
		return committed{}
	}
	wait = func() error {
		<-finished
		return runErr
	}
	return next, wait
}

// TestReceiveTimeoutEndsASilentSession (postgres.receive_timeout): a
// walsender that says nothing though asked to answer, here frozen with
// SIGSTOP as a black hole would leave it, ends the session with a
// DeadConnError within about the timeout; a quiet database whose
// walsender answers is not taken for dead.
//
// The stream asks for an answer after half the timeout in silence, and
// takes the connection for dead once the whole timeout passed: a quiet
// walsender has half the timeout to answer, which it is given room for on
// a loaded machine (two seconds, not one). The session ends within
// receive_timeout and a status_interval of the walsender's last answer,
// the promise; how late past that a loaded machine runs the loop no
// setting bounds, so the bound is what tells a stream that applied
// receive_timeout from one that did not: the default receive_timeout
// (30 s), which a stream that ignored the setting would take.
func TestReceiveTimeoutEndsASilentSession(t *testing.T) {
	db, c, from := slotted(t)
	c.StatusInterval, c.ReceiveTimeout = 100*time.Millisecond, 2*time.Second
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := wal.Open(ctx, c, from, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	acks := &movingAcks{}
	acks.pos.Store(uint64(from))
	done := make(chan error, 1)
	go func() {
		done <- s.Run(ctx, func(pglogrepl.LSN, []byte) error { return nil }, acks, nil)
	}()
	defer s.Close(context.Background(), acks)

	// Quiet for three timeouts, each with two asks answered: the
	// walsender answers, the session lives.
	select {
	case err := <-done:
		t.Fatalf("a quiet database's session ended: %v", err)
	case <-time.After(3 * c.ReceiveTimeout): // the quiet span under test
	}

	var pid int
	testenv.QueryRow(t, db, `SELECT active_pid FROM pg_replication_slots WHERE slot_name = 'outbox_cdc'`, nil, &pid)
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("freeze the walsender (pid %d): %v", pid, err)
	}
	defer syscall.Kill(pid, syscall.SIGCONT)
	frozen := time.Now()
	select {
	case err := <-done:
		var dead *wal.DeadConnError
		if !errors.As(err, &dead) {
			t.Fatalf("Run returned %v; want a DeadConnError", err)
		}
		// The silence began at the walsender's last answer, up to half
		// the timeout before it froze.
		if took := time.Since(frozen); took >= postgres.DefaultReceiveTimeout {
			t.Errorf("the session ended %s after the walsender froze; want about receive_timeout (%s), not the default's %s", took, c.ReceiveTimeout, postgres.DefaultReceiveTimeout)
		}
		if !strings.Contains(err.Error(), "postgres.receive_timeout") {
			t.Errorf("the error does not name the setting: %v", err)
		}
	case <-time.After(2 * postgres.DefaultReceiveTimeout):
		t.Fatalf("a silent walsender's session did not end within %s", 2*postgres.DefaultReceiveTimeout)
	}
}

// releaser is acks' batching, if it has one.
func releaser(acks wal.Acks) wal.Releaser {
	if r, ok := acks.(wal.Releaser); ok {
		return r
	}
	return nil
}
