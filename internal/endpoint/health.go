package endpoint

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Health is what a pipeline says of itself to the probes: a Source. What
// it does (Set), whether a session streams and when its replication loop
// last went round (Streaming), and when it last made progress otherwise
// (Busy). Healthy means "not stuck", never "not busy" nor "slow": a loop
// that runs, a standby that sees a live holder and a first start's
// backfill that sends chunks, or whose query the server works on, are all
// healthy however long they last; a backfill whose query waits on a lock
// is not (postgres.WatchBackend). Its methods are safe from any goroutine.
type Health struct {
	// UnhealthyAfter is http.unhealthy_after: how long the pipeline may go
	// without streaming or progress before Healthy fails.
	UnhealthyAfter time.Duration
	// LoopSilence is how long a streaming session's loop may go without a
	// beat before Healthy fails.
	LoopSilence time.Duration
	// Gauge, when set, is 1 while the pipeline streams and 0 otherwise
	// (cdc_streaming).
	Gauge prometheus.Gauge

	state atomic.Pointer[State]
	beat  atomic.Pointer[beating]
	// idleSince is when the pipeline last streamed or made progress (unix
	// nanoseconds).
	idleSince atomic.Int64
}

// State is what the pipeline is doing, for /readyz.
type State struct {
	// Streaming: this instance holds the slot and streams.
	Streaming bool
	// Detail says what it does: streaming, waiting for the slot (a
	// standby), reconnecting, stopped. It names no host or role.
	Detail string
	// Reason is why, when Detail says it retries: the error, which may
	// name hosts and roles (/readyz shows it only with the token).
	Reason string
	Since  time.Time
}

// Set says what the pipeline does, and why when it retries.
func (h *Health) Set(streaming bool, detail, reason string) {
	h.state.Store(&State{Streaming: streaming, Detail: detail, Reason: reason, Since: time.Now()})
	if h.Gauge != nil {
		v := 0.0
		if streaming {
			v = 1
		}
		h.Gauge.Set(v)
	}
}

// beating is a streaming session's loop: its last round, told by last,
// and when the session began streaming, which stands for a last round
// until the loop's first.
type beating struct {
	last  func() time.Time
	since time.Time
}

// Streaming says a session streams, its loop's last round told by beat;
// nil says the session ended, which counts as progress.
func (h *Health) Streaming(beat func() time.Time) {
	if beat == nil {
		h.beat.Store(nil)
		h.Busy()
		return
	}
	h.beat.Store(&beating{last: beat, since: time.Now()})
}

// Busy notes progress outside a session: the pipeline started, a
// standby saw a live holder, a first start's backfill sent a chunk or the
// server works on its query.
func (h *Health) Busy() { h.idleSince.Store(time.Now().UnixNano()) }

// State returns what the pipeline is doing.
func (h *Health) State() State {
	if st := h.state.Load(); st != nil {
		return *st
	}
	return State{}
}

// Ready reports whether this instance holds the slot and streams, and what
// it does, for /readyz.
func (h *Health) Ready() (bool, string) {
	st := h.State()
	return st.Streaming, st.Detail
}

// Why is the error the pipeline retries after, if any, for /readyz with
// the token.
func (h *Health) Why() string { return h.State().Reason }

// Healthy reports whether the pipeline's loops are alive: the replication
// loop of a streaming session runs at least every status interval, so
// silence for LoopSilence means it is stuck.
func (h *Health) Healthy() error {
	beat := h.beat.Load()
	if beat == nil {
		// Between sessions: a standby waiting for a live holder is
		// healthy, and so is a first start whose backfill makes
		// progress; retrying, or a backfill that neither sent a chunk
		// nor had the server work on its query, for longer than
		// UnhealthyAfter is stuck.
		if d := time.Since(time.Unix(0, h.idleSince.Load())); d > h.UnhealthyAfter {
			return fmt.Errorf("not streaming for %s (http.unhealthy_after %s): %s", d.Round(time.Second), h.UnhealthyAfter, h.State().Detail)
		}
		return nil
	}
	// A loop that has not run its first round yet (its beat is zero)
	// is as old as the session's streaming, not 56 years.
	last := beat.last()
	if last.IsZero() {
		last = beat.since
	}
	if d := time.Since(last); d > h.LoopSilence {
		return fmt.Errorf("the replication loop has not run for %s", d.Round(time.Second))
	}
	return nil
}
