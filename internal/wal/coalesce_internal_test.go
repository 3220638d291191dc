package wal

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// scriptedConn answers each Read with the next of its sizes (0: a
// timeout) and records when each read happened on the fake clock.
type scriptedConn struct {
	net.Conn
	sizes []int
	clock *time.Time
	at    []time.Duration // each read's time since the start
	start time.Time
}

func (c *scriptedConn) Read(p []byte) (int, error) {
	c.at = append(c.at, c.clock.Sub(c.start))
	n := c.sizes[0]
	c.sizes = c.sizes[1:]
	if n == 0 {
		return 0, &net.OpError{Op: "read", Err: timeoutErr{}}
	}
	return min(n, len(p)), nil
}

type timeoutErr struct{}

func (timeoutErr) Error() string { return "i/o timeout" }
func (timeoutErr) Timeout() bool { return true }

// TestCoalescingReads: after a read that drained the socket, the next
// waits until the batch time has passed since; after a full read, an
// error, or with no batch time, the next read is at once.
func TestCoalescingReads(t *testing.T) {
	const ms = time.Millisecond
	for _, tt := range []struct {
		name   string
		window time.Duration
		sizes  []int           // what each read returns, of 100 asked
		gaps   []time.Duration // the caller's time between reads
		want   []time.Duration // when each read reached the socket
	}{
		{"short reads are spaced by the batch time", ms, []int{10, 10, 10}, []time.Duration{0, ms / 4, 0}, []time.Duration{0, ms, 2 * ms}},
		{"a full read is followed at once", ms, []int{100, 100, 10, 10}, []time.Duration{0, 0, 0, 0}, []time.Duration{0, 0, 0, ms}},
		{"a socket idle past the batch time is read at once", ms, []int{10, 10}, []time.Duration{0, 5 * ms}, []time.Duration{0, 5 * ms}},
		{"a timeout is followed at once", ms, []int{10, 0, 10}, []time.Duration{0, 0, 0}, []time.Duration{0, ms, ms}},
		{"no batch time, no wait", 0, []int{10, 10, 10}, []time.Duration{0, 0, 0}, []time.Duration{0, 0, 0}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			now := time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC)
			sc := &scriptedConn{sizes: tt.sizes, clock: &now, start: now}
			c := &coalescingConn{Conn: sc, now: func() time.Time { return now }, sleep: func(d time.Duration) { now = now.Add(d) }}
			c.window.Store(int64(tt.window))
			buf := make([]byte, 100)
			for _, gap := range tt.gaps {
				now = now.Add(gap)
				_, _ = c.Read(buf) // the scripted timeout is the one error
			}
			for i, want := range tt.want {
				if sc.at[i] != want {
					t.Fatalf("read %d reached the socket at %s, want %s (all: %v)", i, sc.at[i], want, sc.at)
				}
			}
		})
	}
}

// TestCoalescerUnderTLS finds the coalescing socket under pgconn's TLS.
func TestCoalescerUnderTLS(t *testing.T) {
	raw, other := net.Pipe()
	defer raw.Close()
	defer other.Close()
	c := &coalescingConn{Conn: raw}
	if coalescer(c) != c || coalescer(tls.Client(c, &tls.Config{})) != c || coalescer(raw) != nil {
		t.Fatal("coalescer does not find the coalescing socket, under TLS or not")
	}
}

// TestDrainedBeforeWait: a read that follows a drained one first lets the
// stream send what it holds (drained), then waits for the later of the
// batch time and the stream's next batch; a read after a full one calls
// nothing and waits for nothing.
func TestDrainedBeforeWait(t *testing.T) {
	const ms = time.Millisecond
	now := time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC)
	sc := &scriptedConn{sizes: []int{10, 10, 100, 10, 10}, clock: &now, start: now}
	// drained notes when it ran, and says the next batch may go 5ms later.
	var calls []time.Duration
	c := &coalescingConn{Conn: sc, now: func() time.Time { return now }, sleep: func(d time.Duration) { now = now.Add(d) },
		drained: func() time.Time { calls = append(calls, now.Sub(sc.start)); return now.Add(5 * ms) }}
	c.window.Store(int64(ms))
	buf := make([]byte, 100)
	for range 5 {
		_, _ = c.Read(buf)
	}
	// Read 1 drained the socket at 0: read 2 waits for the batch at 5ms,
	// not just the batch time. Read 2 drained too: read 3 waits until
	// 10ms. Read 3 was full: read 4 is at once, and drained is not
	// called. Read 4 drained: read 5 waits until 15ms.
	if want := []time.Duration{0, 5 * ms, 10 * ms, 10 * ms, 15 * ms}; fmt.Sprint(sc.at) != fmt.Sprint(want) {
		t.Fatalf("reads reached the socket at %v, want %v", sc.at, want)
	}
	if want := []time.Duration{0, 5 * ms, 10 * ms}; fmt.Sprint(calls) != fmt.Sprint(want) {
		t.Fatalf("drained ran at %v, want %v: once before each wait, none after a full read", calls, want)
	}
}

// TestQuietWhileWaiting: during a wait the socket's receive low-water mark
// is raised, so that the walsender's sends wake no one, and it is back to
// one byte for the read, which therefore returns what came meanwhile.
func TestQuietWhileWaiting(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("SO_RCVLOWAT is read back only on Linux")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() { c, _ := ln.Accept(); accepted <- c }()
	pcfg := &pgconn.Config{DialFunc: (&net.Dialer{}).DialContext}
	coalesce(pcfg)
	conn, err := pcfg.DialFunc(context.Background(), "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	server := <-accepted
	defer server.Close()
	c := conn.(*coalescingConn)
	lowWater := func() int {
		var v int
		_ = c.raw.Control(func(fd uintptr) { v, _ = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVLOWAT) })
		return v
	}
	var during int
	c.sleep = func(time.Duration) {
		during = lowWater()
		if _, err := server.Write([]byte("sent during the wait")); err != nil {
			t.Error(err)
		}
	}
	c.window.Store(int64(time.Hour))
	c.short = time.Now() // the last read drained the socket
	buf := make([]byte, 100)
	n, err := c.Read(buf)
	if err != nil || string(buf[:n]) != "sent during the wait" {
		t.Fatalf("the read after the wait returned %q, %v", buf[:n], err)
	}
	if during < quietLowWater || lowWater() != 1 {
		t.Fatalf("low-water mark %d during the wait and %d after it; want at least %d, then 1", during, lowWater(), quietLowWater)
	}
}

// TestLiveAfter: a stream turns live on a transaction under a second old
// that came after a keepalive (the walsender had sent all there was), and
// falls behind on one over two seconds old; in between it stays. A young
// transaction with no keepalive before it is a young backlog's.
func TestLiveAfter(t *testing.T) {
	for _, tt := range []struct {
		live, atEnd bool
		age         time.Duration
		want        bool
	}{
		{false, true, 500 * time.Millisecond, true},
		{false, false, 500 * time.Millisecond, false},
		{false, true, 1500 * time.Millisecond, false},
		{true, false, 1500 * time.Millisecond, true},
		{true, true, 2500 * time.Millisecond, false},
		{true, false, 2500 * time.Millisecond, false},
		{false, true, 2500 * time.Millisecond, false},
	} {
		if got := liveAfter(tt.live, tt.atEnd, tt.age); got != tt.want {
			t.Errorf("live %v, keepalive before %v, a transaction %s old: live %v, want %v", tt.live, tt.atEnd, tt.age, got, tt.want)
		}
	}
}
