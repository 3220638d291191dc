package retry

import (
	"context"
	"testing"
	"time"
)

// TestJitter: a wait falls between half the backoff and the backoff, and
// the waits differ, so that instances that failed together spread out.
func TestJitter(t *testing.T) {
	seen := map[time.Duration]bool{}
	for i := 0; i < 200; i++ {
		d := Jitter(time.Second)
		if d < 500*time.Millisecond || d > time.Second {
			t.Fatalf("Jitter(1s) = %v; want within [500ms, 1s]", d)
		}
		seen[d] = true
	}
	if len(seen) < 100 {
		t.Fatalf("200 waits took %d distinct values; want them spread", len(seen))
	}
}

// TestBackoffDoublesToMaxAndResets.
func TestBackoffDoublesToMaxAndResets(t *testing.T) {
	b := New(time.Second, 5*time.Second)
	var got []time.Duration
	for i := 0; i < 5; i++ {
		got = append(got, b.Current())
		if d := b.Next(); d < got[i]/2 || d > got[i] {
			t.Fatalf("Next = %v with Current %v; want within [Current/2, Current]", d, got[i])
		}
	}
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 5 * time.Second, 5 * time.Second}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("waits %v; want %v", got, want)
		}
	}
	b.Reset()
	if b.Current() != time.Second {
		t.Fatalf("Current after Reset = %v; want 1s", b.Current())
	}
}

func TestSleepEndsWithTheContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if Sleep(ctx, time.Hour) {
		t.Fatal("Sleep waited an hour on an ended context")
	}
	if !Sleep(context.Background(), time.Millisecond) {
		t.Fatal("Sleep(1ms) did not wait it out")
	}
}
