package sink

import (
	"strings"
	"testing"
)

// FuzzSameTopic: SameTopic is Kafka's collision rule, '.' and '_' alike,
// written without allocating; it agrees with the rule written plainly.
func FuzzSameTopic(f *testing.F) {
	for _, s := range [][2]string{{"a.b", "a_b"}, {"a.b", "a.b"}, {"a.b", "a-b"}, {"outbox.parked", "outbox_parked"}, {"", ""}, {"a", "ab"}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		want := strings.ReplaceAll(a, ".", "_") == strings.ReplaceAll(b, ".", "_")
		if got := SameTopic(a, b); got != want {
			t.Fatalf("SameTopic(%q, %q) = %v, want %v", a, b, got, want)
		}
	})
}
