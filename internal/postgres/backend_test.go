package postgres_test

import (
	"context"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxcdc/cdc/internal/postgres"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// TestBackendWorking pins what counts as the server working on a
// statement: running, even asleep, yes; idle, waiting on a lock or on the
// client to read what it sent, or gone, no.
func TestBackendWorking(t *testing.T) {
	db := testenv.Require(t, pg).NewDatabase(t)
	ctx := context.Background()
	look := testenv.Connect(t, db)
	holder := testenv.Connect(t, db)
	if _, err := holder.Exec(ctx, "SELECT pg_advisory_lock(47)"); err != nil {
		t.Fatal(err)
	}
	// running runs sql on a connection of its own, and returns its
	// backend's pid once pg_stat_activity shows it as until says.
	running := func(t *testing.T, sql, until string) uint32 {
		conn := testenv.Connect(t, db)
		pid := conn.PgConn().PID()
		sctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); _, _ = conn.Exec(sctx, sql) }()
		t.Cleanup(func() { cancel(); <-done }) // before conn closes
		testenv.Eventually(t, time.Minute, "the statement to run", func() bool {
			var n int
			testenv.QueryRow(t, db, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND "+until, []any{int64(pid)}, &n)
			return n == 1
		})
		return pid
	}
	idle := testenv.Connect(t, db)
	for _, tc := range []struct {
		name string
		pid  func(t *testing.T) uint32
		want bool
	}{
		{"a statement the server works on, asleep or not", func(t *testing.T) uint32 { return running(t, "SELECT pg_sleep(30)", "state = 'active'") }, true},
		{"a statement waiting on a lock", func(t *testing.T) uint32 {
			return running(t, "SELECT pg_advisory_lock(47)", "wait_event_type = 'Lock'")
		}, false},
		{"a copy the client does not read", func(t *testing.T) uint32 { return unread(t, db) }, false},
		{"an idle connection", func(*testing.T) uint32 { return idle.PgConn().PID() }, false},
		{"a backend that is gone", func(*testing.T) uint32 { return 1 << 30 }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := postgres.BackendWorking(ctx, look, tc.pid(t))
			if err != nil || got != tc.want {
				t.Fatalf("BackendWorking = %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

// TestWatchBackend: the watch calls working while the server works on a
// statement, not before its first look a second in (never more calls than
// whole seconds since it started, however slow the machine: a ticker does
// not fire early), and not after stop.
func TestWatchBackend(t *testing.T) {
	db := testenv.Require(t, pg).NewDatabase(t)
	ctx := context.Background()
	conn := testenv.Connect(t, db)
	var calls atomic.Int32
	started := time.Now()
	stop := postgres.WatchBackend(ctx, cfg(db), conn.PgConn().PID(), func() { calls.Add(1) })
	// A statement that runs until the watch has seen it twice, however
	// long a loaded machine makes that take.
	sctx, cancel := context.WithCancel(ctx)
	ran := make(chan struct{})
	go func() { defer close(ran); _, _ = conn.Exec(sctx, "SELECT pg_sleep(600)") }()
	defer func() { cancel(); <-ran }()
	testenv.Eventually(t, time.Minute, "the watch to call working twice", func() bool { return calls.Load() >= 2 })
	stop()
	took := time.Since(started)
	if n := calls.Load(); n > int32(took/time.Second) {
		t.Fatalf("%d calls in %s of work: want one a second, at most", n, took.Round(time.Millisecond))
	}
	// The statement still runs: a watch that went on after stop would
	// call working at its next look, a second on (backendLook).
	after := calls.Load()
	time.Sleep(1500 * time.Millisecond) // the span under test: past the next look
	if calls.Load() != after {
		t.Fatal("working called after stop")
	}
}

// TestVisible: a transaction with an xid shows in no snapshot while it is
// open, and in every one once it committed or rolled back; the 32-bit xid
// is placed in the snapshot's epoch.
func TestVisible(t *testing.T) {
	db := testenv.Require(t, pg).NewDatabase(t)
	ctx := context.Background()
	look := testenv.Connect(t, db)
	for _, end := range []string{"COMMIT", "ROLLBACK"} {
		tx, err := testenv.Connect(t, db).Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var xid uint32
		if err := tx.QueryRow(ctx, `SELECT (pg_current_xact_id()::text::int8 % 4294967296)::int8`).Scan(&xid); err != nil {
			t.Fatal(err)
		}
		if v, err := postgres.Visible(ctx, look, xid); err != nil || v {
			t.Fatalf("open transaction %d: visible %v, %v; want false", xid, v, err)
		}
		if _, err := tx.Exec(ctx, end); err != nil {
			t.Fatal(err)
		}
		if v, err := postgres.Visible(ctx, look, xid); err != nil || !v {
			t.Fatalf("transaction %d after %s: visible %v, %v; want true", xid, end, v, err)
		}
		if v, err := postgres.Visible(ctx, look, xid-1); err != nil || !v {
			t.Fatalf("an older transaction %d: visible %v, %v; want true", xid-1, v, err)
		}
	}
}

// unread starts a copy on a connection of its own whose rows the client
// stops taking, and returns its backend's pid once the server waits to
// write them (ClientWrite).
func unread(t *testing.T, db string) uint32 {
	conn := testenv.Connect(t, db)
	pid := conn.PgConn().PID()
	held := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = conn.PgConn().CopyTo(context.Background(), blocked(held), "COPY (SELECT repeat('x', 10000) FROM generate_series(1, 1000000)) TO STDOUT")
	}()
	t.Cleanup(func() { close(held); <-done })
	testenv.Eventually(t, time.Minute, "the copy to wait on its client", func() bool {
		var n int
		testenv.QueryRow(t, db, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Client'", []any{int64(pid)}, &n)
		return n == 1
	})
	return pid
}

// blocked is a writer whose first write waits until held is closed, then
// fails.
type blocked chan struct{}

func (b blocked) Write([]byte) (int, error) { <-b; return 0, io.EOF }
