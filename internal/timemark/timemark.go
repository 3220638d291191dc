package timemark

import (
	"sort"
	"time"

	"github.com/jackc/pglogrepl"
)

// Mark is a WAL position and a time at which the WAL had reached it.
type Mark struct {
	LSN  pglogrepl.LSN
	Time time.Time
}

// List is a bounded, time-ordered list of (position, time) samples of the
// confirmed position. They let the replay window turn a time into a WAL
// position without decoding: a transaction that committed after a mark's
// time (plus Skew) has its commit record after the mark's LSN.
type List []Mark

// Skew covers the time between a transaction taking its commit timestamp
// and writing its commit record: a mark is only trusted for times at least
// this much after it.
const Skew = 2 * time.Second

// Add records m if it is at least every after the newest mark, and drops
// marks older than keep, except the newest of those (the replay slot's next
// target may be it).
func (ms List) Add(m Mark, every time.Duration, keep time.Time) List {
	if n := len(ms); n > 0 && (m.LSN <= ms[n-1].LSN || m.Time.Sub(ms[n-1].Time) < every) {
		return ms
	}
	ms = append(ms, m)
	i := sort.Search(len(ms), func(i int) bool { return !ms[i].Time.Before(keep) })
	if i > 1 {
		ms = append(ms[:0:0], ms[i-1:]...)
	}
	return ms
}

// Before returns the newest mark whose time is at least Skew before t: every
// transaction that committed at or after t has its commit record at or
// after that mark's LSN. ok is false when no mark is that old.
func (ms List) Before(t time.Time) (Mark, bool) {
	for i := len(ms) - 1; i >= 0; i-- {
		if !ms[i].Time.After(t.Add(-Skew)) {
			return ms[i], true
		}
	}
	return Mark{}, false
}
