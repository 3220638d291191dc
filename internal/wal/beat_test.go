package wal

import "testing"

// TestBeatBeforeTheFirstRound: a stream whose loop has not gone round yet
// beats the zero time, which /healthz reads as "since streaming began",
// not 1970 (a loop silent for 56 years: pipeline tests failed on it).
func TestBeatBeforeTheFirstRound(t *testing.T) {
	s := &Stream{}
	if b := s.Beat(); !b.IsZero() {
		t.Fatalf("Beat() before the first round = %v; want the zero time", b)
	}
	s.beat.Store(1e18)
	if b := s.Beat(); b.UnixNano() != 1e18 {
		t.Fatalf("Beat() = %v; want the stored round", b)
	}
}
