package pipeline

import (
	"testing"
	"time"
)

// TestJitter: a reconnect waits between half the backoff and the backoff,
// and the waits differ, so that instances that failed together spread out.
func TestJitter(t *testing.T) {
	seen := map[time.Duration]bool{}
	for i := 0; i < 200; i++ {
		d := jitter(time.Second)
		if d < 500*time.Millisecond || d > time.Second {
			t.Fatalf("jitter(1s) = %v; want within [500ms, 1s]", d)
		}
		seen[d] = true
	}
	if len(seen) < 100 {
		t.Fatalf("200 waits took %d distinct values; want them spread", len(seen))
	}
}
