package delivery

import (
	"testing"
	"time"
)

// TestCommitDueCatchingUp: a stream that is caught up commits at
// commit_events or commit_interval; one catching up (the newest
// transaction it read more than a second old, Tracker.Lag) commits ten times
// fewer transactions, its interval capped at a second and at half the
// transaction timeout, and never below commit_interval.
func TestCommitDueCatchingUp(t *testing.T) {
	const ms = time.Millisecond
	for _, c := range []struct {
		name              string
		events            int
		open, lag         time.Duration
		maxEvents         int
		interval, timeout time.Duration
		want              bool
	}{
		{"live, below both", 9_999, 99 * ms, 5 * ms, 10_000, 100 * ms, time.Minute, false},
		{"live, events reached", 10_000, 1 * ms, 5 * ms, 10_000, 100 * ms, time.Minute, true},
		{"live, interval reached", 1, 100 * ms, 5 * ms, 10_000, 100 * ms, time.Minute, true},
		{"a second behind is still live", 10_000, 1 * ms, time.Second, 10_000, 100 * ms, time.Minute, true},
		{"catching up, events ten times", 10_000, 1 * ms, 1500 * ms, 10_000, 100 * ms, time.Minute, false},
		{"catching up, events reached", 100_000, 1 * ms, 1500 * ms, 10_000, 100 * ms, time.Minute, true},
		{"catching up, interval ten times", 1, 999 * ms, 1500 * ms, 10_000, 100 * ms, time.Minute, false},
		{"catching up, interval reached", 1, time.Second, 1500 * ms, 10_000, 100 * ms, time.Minute, true},
		{"catching up, capped at a second", 1, time.Second, time.Hour, 10_000, 500 * ms, time.Minute, true},
		{"catching up, capped at half the timeout", 1, 500 * ms, time.Hour, 10_000, 200 * ms, time.Second, true},
		{"catching up, never below commit_interval", 1, 5*time.Second - ms, time.Hour, 10_000, 5 * time.Second, time.Minute, false},
		{"catching up, commit_interval reached", 1, 5 * time.Second, time.Hour, 10_000, 5 * time.Second, time.Minute, true},
	} {
		if got := commitDue(c.events, c.open, c.lag, c.maxEvents, c.interval, c.timeout); got != c.want {
			t.Errorf("%s: commitDue(%d events, open %s, lag %s; %d, %s, timeout %s) = %v, want %v",
				c.name, c.events, c.open, c.lag, c.maxEvents, c.interval, c.timeout, got, c.want)
		}
	}
}
