package copyread

import "time"

// SetCancelWait sets how long a cancel request waits for its answer, for
// a test, until the returned func sets it back.
func SetCancelWait(d time.Duration) (restore func()) {
	was := cancelWait
	cancelWait = d
	return func() { cancelWait = was }
}
