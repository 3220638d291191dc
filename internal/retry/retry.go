// Package retry is the one way the connector waits before it tries again
// (a session after an error, an interrupted backfill job): a wait that
// doubles from its first value up to its last, each spread over [d/2, d]
// so that instances that lost a server together do not all come back in
// the same instant. It imports nothing of the project.
package retry

import (
	"context"
	"math/rand/v2"
	"time"
)

// Backoff is the wait before each try of one loop. It is not safe for
// concurrent use: one loop owns it.
type Backoff struct {
	first, max, cur time.Duration
}

// New is a backoff that waits first, then twice as long each time, up to
// max.
func New(first, max time.Duration) *Backoff {
	return &Backoff{first: first, max: max, cur: first}
}

// Current is the wait before the next try, before it is spread: what the
// log says.
func (b *Backoff) Current() time.Duration { return b.cur }

// Next is the wait before the next try, spread (Jitter); the one after
// is twice as long, up to max.
func (b *Backoff) Next() time.Duration {
	d := Jitter(b.cur)
	b.cur = min(2*b.cur, b.max)
	return d
}

// Reset starts again from the first wait: the loop's last try went well.
func (b *Backoff) Reset() { b.cur = b.first }

// Jitter spreads d over [d/2, d].
func Jitter(d time.Duration) time.Duration {
	return d/2 + rand.N(d/2+1)
}

// Sleep waits d, or until ctx ends; it reports whether it waited all of d.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
