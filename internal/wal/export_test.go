package wal

import "time"

// Batching reports whether s's reads are being batched (postgres.read_batch):
// it streams live, with a batch time.
func Batching(s *Stream) bool {
	c := coalescer(s.conn.Conn())
	return c != nil && c.window.Load() > 0
}

// SetLiveAge sets liveAge, how young a transaction turns a stream live,
// for streams opened after it, until restore. No stream may run meanwhile.
func SetLiveAge(d time.Duration) (restore func()) {
	old := liveAge
	liveAge = d
	return func() { liveAge = old }
}
