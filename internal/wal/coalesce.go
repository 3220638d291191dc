package wal

import (
	"context"
	"crypto/tls"
	"net"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// coalescingConn is the replication connection's socket. While a stream
// runs live (its transactions committed a moment ago), a read that found
// the socket drained (it returned less than it could hold) makes the next
// one wait until ReadBatch has passed since: the messages that arrive
// meanwhile come in one read instead of one each. A walsender sends each
// pgoutput message as it decodes it, so a live stream would be read
// nearly once an event, and the reads, their epoll waits and the wake-ups
// that go with them would be much of the connector's CPU
// (docs/benchmarks.md, "Where the time goes"). An idle socket is read as soon as
// data comes, so a lone event waits for nothing; a busy stream's events
// wait at most ReadBatch, or until the producer's next batch may go. A
// stream behind (a backlog, or catching up after a stall) reads at once:
// there the walsender is the limit, and a pause is time it waits with a
// full socket.
//
// Before it waits, the read lets the stream send what it holds for Kafka
// (drained), and it waits at least until the time that returns: the next
// batch then goes right after the read that brings it, and the read and
// the batch share a wake-up. During the wait the socket's receive
// low-water mark is raised (setLowWater): each message the walsender sends
// makes the socket readable, and, though nobody reads it, wakes the
// runtime's poller: at high rates more thread wake-ups than the work
// itself (docs/benchmarks.md, "Where the time goes").
type coalescingConn struct {
	net.Conn
	window atomic.Int64 // the batch time in nanoseconds; 0 unless a stream runs live
	short  time.Time    // when the last read found the socket drained
	// drained, while a stream runs, sends what it holds for Kafka and
	// returns when its next batch may go. Read calls it on the stream's
	// goroutine: during Run only Run's loop reads (Stream.Run).
	drained func() time.Time
	// raw is the socket under Conn, for its low-water mark; nil if none.
	raw syscall.RawConn
	// now and sleep are the clock (tests set their own).
	now   func() time.Time
	sleep func(time.Duration)
}

// quietLowWater is the receive low-water mark during a wait: more than a
// wait's worth of a live stream (40,000 events a second of 300 bytes are
// 60 KB in 5 ms), so that it wakes nobody, and small enough that Linux
// grows the socket's buffer to match by no more than half a megabyte.
const quietLowWater = 256 << 10

// liveAge is how long ago a transaction may have committed for the
// stream that receives it to turn live: a walsender sends only flushed
// WAL, which with synchronous_commit off is up to three wal_writer_delays
// (200 ms by default) after the commit. A live stream falls behind when a
// transaction is more than twice that old: in between it stays as it
// was, so that a stream lagging about a second does not switch at every
// transaction (postgres.Config.OnLive may stop the world to switch). The commit
// time is the server's clock: a skew of more than this between the two
// only turns batching off (the server behind) or leaves it on while
// catching up (ahead). A variable only so that a test can lengthen it
// (SetLiveAge).
var liveAge = time.Second

// liveAfter is whether a stream that was live (or not) is live after a
// transaction committed age ago; atEnd: a keepalive came before it, so
// the walsender had sent all there was. A stream behind turns live only
// then: a backlog written less than a second before the stream reads it
// (a restart, the benchmark's drains) is read as a backlog, at once and
// with every P, not batched as if it were arriving (docs/design.md, "Read
// batching").
func liveAfter(live, atEnd bool, age time.Duration) bool {
	if live {
		return age <= 2*liveAge
	}
	return atEnd && age < liveAge
}

// batchReads turns batching on, with batch time w, or off.
func (c *coalescingConn) batchReads(on bool, w time.Duration) {
	if !on {
		w = 0
	}
	c.window.Store(int64(w))
}

// Read waits out the rest of the window after a short read, and at least
// until the stream's next batch may go, then reads. Only the connection's
// reader calls it, one call at a time.
func (c *coalescingConn) Read(p []byte) (int, error) {
	if w := time.Duration(c.window.Load()); w > 0 && !c.short.IsZero() {
		until := c.short.Add(w)
		if c.drained != nil {
			until = maxTime(until, c.drained())
		}
		if wait := until.Sub(c.now()); wait > 0 {
			setLowWater(c.raw, quietLowWater)
			c.sleep(wait)
			setLowWater(c.raw, 1)
		}
	}
	n, err := c.Conn.Read(p)
	if n > 0 && n < len(p) {
		c.short = c.now()
	} else {
		c.short = time.Time{}
	}
	return n, err
}

// coalesce makes pcfg dial coalescing sockets.
func coalesce(pcfg *pgconn.Config) {
	dial := pcfg.DialFunc
	pcfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		cc := &coalescingConn{Conn: c, now: time.Now, sleep: time.Sleep}
		if sc, ok := c.(syscall.Conn); ok {
			cc.raw, _ = sc.SyscallConn()
		}
		return cc, nil
	}
}

// coalescer finds the coalescing socket under conn (under TLS, if any).
func coalescer(conn net.Conn) *coalescingConn {
	if t, ok := conn.(*tls.Conn); ok {
		conn = t.NetConn()
	}
	c, _ := conn.(*coalescingConn)
	return c
}
