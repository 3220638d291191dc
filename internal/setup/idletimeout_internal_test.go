package setup

import (
	"strings"
	"testing"
	"time"
)

// TestIdleTimeoutWarning: cdc check warns about an
// idle_replication_slot_timeout that a day-long stop outlasts (the main
// slot is idle while the connector is stopped), and, with a replay
// window, one that the window and such a stop outlast (the replay slot is
// idle by design); off (0) or long enough, nothing.
func TestIdleTimeoutWarning(t *testing.T) {
	const stop, replay = "a stop longer than", "the replay slot is idle by design"
	for _, tt := range []struct {
		timeout, window time.Duration
		want            []string // "" in want: no warning
		not             []string
	}{
		{0, 0, nil, nil},
		{0, 7 * 24 * time.Hour, nil, nil},
		{time.Minute, 0, []string{"idle_replication_slot_timeout is 1min", stop + " 1min loses the slot", "at least '1d'"}, []string{replay}},
		{23 * time.Hour, 0, []string{"is 23h", stop + " 23h", "at least '1d'"}, []string{replay}},
		{LongestStop, 0, nil, nil},
		{90 * time.Second, 0, []string{"is 90s"}, nil},
		{time.Hour, time.Hour, []string{"is 1h", stop + " 1h", replay + " for replay.window (1h)", "at least '25h'"}, nil},
		{LongestStop, time.Hour, []string{"is 1d", replay + " for replay.window (1h)", "at least '25h'"}, []string{stop}},
		{25 * time.Hour, 90 * time.Minute, []string{"is 25h", "replay.window (90min)", "at least '1530min'"}, []string{stop}},
		{25 * time.Hour, time.Hour, nil, nil},
		{30 * 24 * time.Hour, 7 * 24 * time.Hour, nil, nil},
	} {
		got := IdleTimeoutWarning(tt.timeout, tt.window)
		if (got == "") != (tt.want == nil) {
			t.Errorf("timeout %s, window %s: %q; want a warning: %v", tt.timeout, tt.window, got, tt.want != nil)
			continue
		}
		if got == "" {
			continue
		}
		for _, w := range append(tt.want, "ALTER SYSTEM SET idle_replication_slot_timeout = 0; SELECT pg_reload_conf()", `docs/operations.md, "Lost slot"`) {
			if !strings.Contains(got, w) {
				t.Errorf("timeout %s, window %s: the warning does not say %q: %s", tt.timeout, tt.window, w, got)
			}
		}
		for _, n := range tt.not {
			if strings.Contains(got, n) {
				t.Errorf("timeout %s, window %s: the warning says %q: %s", tt.timeout, tt.window, n, got)
			}
		}
	}
}
