package main

import "testing"

// TestGCSettings: cdc run bounds the heap by max_in_flight_bytes plus its
// headroom and collects at GOGC=200 below that; GOGC in the environment
// keeps the limit and leaves the percentage, GOMEMLIMIT leaves both.
func TestGCSettings(t *testing.T) {
	const inFlight = 64 << 20
	for _, tt := range []struct {
		env     map[string]string
		limit   int64
		percent int
	}{
		{nil, inFlight + memoryHeadroom, 200},
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
