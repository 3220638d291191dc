package pipeline

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// errEnded is what the session's handler returns to end the stream at a
// transaction's boundary, once a stop was asked for (ender).
var errEnded = errors.New("the session ends between two transactions")

// ender ends a session's stream between two transactions. A stop that
// cut a transaction in two (a shutdown, or the tables' watch) left its
// first events in Kafka but out of the last checkpoint, which covers
// whole transactions only (docs/design.md, "Confirm transaction end
// LSNs"), and the next start sent them again. So a stop asked for while
// a transaction is open lets the stream read on to its COMMIT; one asked
// for between two transactions stops the stream at once. The wait is
// bounded (grace): a transaction too large to finish in time is cut, and
// its events are sent again on the next start, as at-least-once allows.
//
// begin and commit run on the stream's goroutine; ask on any. open and
// stopping are read and written in opposite orders on the two sides, so
// at least one of them sees the other's write: either the stream sees
// the request at its next boundary, or ask sees the transaction open and
// leaves the stop to it.
type ender struct {
	stopping atomic.Bool
	open     atomic.Bool // a transaction's events are being sent
	at       atomic.Int64
	once     sync.Once
	timer    atomic.Pointer[time.Timer]
}

// ask asks the stream to stop at the next boundary: stop ends it, at
// once when no transaction is open, after grace otherwise unless the
// stream reached the COMMIT first.
func (e *ender) ask(stop context.CancelFunc, grace time.Duration) {
	e.once.Do(func() {
		e.at.Store(time.Now().UnixNano())
		e.stopping.Store(true)
		if !e.open.Load() {
			stop()
			return
		}
		e.timer.Store(time.AfterFunc(grace, stop))
	})
}

// asked is when the stop was asked for (now, if it was not).
func (e *ender) asked() time.Time {
	if at := e.at.Load(); at != 0 {
		return time.Unix(0, at)
	}
	return time.Now()
}

// begin opens a transaction to send; false: the stream must stop first.
func (e *ender) begin() bool {
	e.open.Store(true)
	if e.stopping.Load() {
		e.open.Store(false)
		return false
	}
	return true
}

// commit closes the transaction; false: the stream must stop now.
func (e *ender) commit() bool {
	e.open.Store(false)
	return !e.stopping.Load()
}

// stopTimer stops the grace timer, once the session ends.
func (e *ender) stopTimer() {
	if t := e.timer.Load(); t != nil {
		t.Stop()
	}
}
