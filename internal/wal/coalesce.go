package wal

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"net"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// coalescingConn is the replication connection's socket. While a stream
// runs live (its transactions committed a moment ago), a read that found
// the socket drained (it returned less than it could hold) makes the next
// one wait until ReadBatch has passed since: the messages that arrive
// meanwhile come in one read instead of one each. A walsender sends each
// pgoutput message as it decodes it, so at 20,000 events a second the
// loop read 16,000 times a second, and the reads, their epoll waits and
// the wake-ups that go with them were a third of the connector's CPU
// (docs/benchmarks.md, "Rate sweep"). An idle socket is read as soon as
// data comes, so a lone event waits for nothing; a busy stream's events
// wait at most ReadBatch, well within the producer's own
// kafka.max_batch_delay. A stream behind (a backlog, or catching up after
// a stall) reads at once: there the walsender is the limit, and a pause
// is time it waits with a full socket.
type coalescingConn struct {
	net.Conn
	window atomic.Int64 // the batch time in nanoseconds; 0 unless a stream runs live
	short  time.Time    // when the last read found the socket drained
	// now and sleep are the clock (tests set their own).
	now   func() time.Time
	sleep func(time.Duration)
}

// liveAge is how long ago a transaction may have committed for the
// stream that receives it to be live: a walsender sends only flushed WAL,
// which with synchronous_commit off is up to three wal_writer_delays
// (200 ms by default) after the commit. The commit time is the server's
// clock: a skew of more than this between the two only turns batching
// off (the server behind) or leaves it on while catching up (ahead).
const liveAge = time.Second

// pgEpoch is where pgoutput's timestamps count from.
var pgEpoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// beginCommitTime is the commit time a pgoutput BEGIN message carries
// ('B', final LSN, commit time in µs since pgEpoch, xid), or false.
func beginCommitTime(data []byte) (time.Time, bool) {
	if len(data) < 21 || data[0] != 'B' {
		return time.Time{}, false
	}
	return pgEpoch.Add(time.Duration(int64(binary.BigEndian.Uint64(data[9:17]))) * time.Microsecond), true
}

// batchReads turns batching on, with batch time w, or off.
func (c *coalescingConn) batchReads(on bool, w time.Duration) {
	if !on {
		w = 0
	}
	c.window.Store(int64(w))
}

// Read waits out the rest of the window after a short read, then reads.
// Only the connection's reader calls it, one call at a time.
func (c *coalescingConn) Read(p []byte) (int, error) {
	if w := time.Duration(c.window.Load()); w > 0 && !c.short.IsZero() {
		if wait := w - c.now().Sub(c.short); wait > 0 {
			c.sleep(wait)
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
		return &coalescingConn{Conn: c, now: time.Now, sleep: time.Sleep}, nil
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
