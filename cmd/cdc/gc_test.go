package main

import (
	"runtime"
	"testing"
)

// TestGCSettings: cdc run bounds the heap by max_in_flight_bytes plus its
// headroom and leaves GOGC to Go (100) or the environment; GOMEMLIMIT in
// the environment leaves both alone.
func TestGCSettings(t *testing.T) {
	const inFlight = 64 << 20
	for _, tt := range []struct {
		env     map[string]string
		limit   int64
		percent int
	}{
		{nil, inFlight + memoryHeadroom, 0},
		{map[string]string{"GOGC": "100"}, inFlight + memoryHeadroom, 0},
		{map[string]string{"GOMEMLIMIT": "1GiB"}, 0, 0},
		{map[string]string{"GOMEMLIMIT": "1GiB", "GOGC": "50"}, 0, 0},
	} {
		limit, percent := gcSettings(inFlight, func(k string) string { return tt.env[k] })
		if limit != tt.limit || percent != tt.percent {
			t.Errorf("env %v: limit %d, GOGC %d; want %d, %d", tt.env, limit, percent, tt.limit, tt.percent)
		}
	}
}

// TestLiveProcs: cdc run runs a live stream on one P and gives the
// runtime's default back when it falls behind, unless the environment
// sets GOMAXPROCS or the default is one already.
func TestLiveProcs(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	if liveProcs(env(map[string]string{"GOMAXPROCS": "4"}), 8) != nil {
		t.Error("GOMAXPROCS set in the environment, and cdc run would change it")
	}
	if liveProcs(env(nil), 1) != nil {
		t.Error("a default of one P, and cdc run would switch it")
	}
	f := liveProcs(env(nil), 2)
	if f == nil {
		t.Fatal("no switch with a default of two Ps")
	}
	before := runtime.GOMAXPROCS(0)
	defer runtime.GOMAXPROCS(before)
	runtime.SetDefaultGOMAXPROCS()
	def := runtime.GOMAXPROCS(0)
	f(true)
	if n := runtime.GOMAXPROCS(0); n != 1 {
		t.Fatalf("live: GOMAXPROCS %d, want 1", n)
	}
	f(false)
	if n := runtime.GOMAXPROCS(0); n != def {
		t.Fatalf("behind: GOMAXPROCS %d, want the runtime's default %d", n, def)
	}
}
