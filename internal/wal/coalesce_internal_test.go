package wal

import (
	"crypto/tls"
	"encoding/binary"
	"net"
	"testing"
	"time"
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

// TestBeginCommitTime reads the commit time of pgoutput's BEGIN, and
// nothing from other messages or a short one.
func TestBeginCommitTime(t *testing.T) {
	at := time.Date(2026, 11, 24, 10, 0, 0, 123456000, time.UTC)
	b := []byte{'B'}
	b = binary.BigEndian.AppendUint64(b, 0x1000)
	b = binary.BigEndian.AppendUint64(b, uint64(at.Sub(pgEpoch).Microseconds()))
	b = binary.BigEndian.AppendUint32(b, 7)
	if got, ok := beginCommitTime(b); !ok || !got.Equal(at) {
		t.Fatalf("BEGIN: %v, %v; want %v", got, ok, at)
	}
	for _, data := range [][]byte{b[:20], append([]byte{'C'}, b[1:]...), nil} {
		if _, ok := beginCommitTime(data); ok {
			t.Fatalf("%q read as a BEGIN", data)
		}
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
