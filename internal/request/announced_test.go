package request

import (
	"fmt"
	"testing"
	"time"
)

// TestAnnouncedIsBounded: the refused ids a pipeline keeps and the
// look-ups of unread ids it makes stay bounded however many ids a role
// announces.
func TestAnnouncedIsBounded(t *testing.T) {
	var a Announced
	for i := 0; i < 3*MaxRefused; i++ {
		a.Refuse("backfill", fmt.Sprint(i))
		if len(a.refused) > MaxRefused {
			t.Fatalf("%d refused ids kept, more than %d", len(a.refused), MaxRefused)
		}
	}
	if !a.Refused("backfill", fmt.Sprint(3*MaxRefused-1)) || a.Refused("backfill", "never") || a.Refused("redrive", fmt.Sprint(3*MaxRefused-1)) {
		t.Fatal("Refused does not answer from the ids kept")
	}

	now := time.Unix(1_000_000, 0)
	allowed := 0
	for i := 0; i < 100; i++ {
		if a.Allow(now) {
			allowed++
		}
	}
	if allowed != LookupsPerSecond {
		t.Fatalf("%d look-ups allowed at once, want %d", allowed, LookupsPerSecond)
	}
	if a.Allow(now.Add(100 * time.Millisecond)) {
		t.Fatal("a look-up allowed a tenth of a second after the budget ran out")
	}
	if !a.Allow(now.Add(time.Second)) {
		t.Fatal("no look-up allowed a second later")
	}
}
