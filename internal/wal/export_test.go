package wal

// Batching reports whether s's reads are being batched (postgres.read_batch):
// it streams live, with a batch time.
func Batching(s *Stream) bool {
	c := coalescer(s.conn.Conn())
	return c != nil && c.window.Load() > 0
}
