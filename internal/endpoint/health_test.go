package endpoint

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

func value(g prometheus.Gauge) float64 {
	var m dto.Metric
	if err := g.Write(&m); err != nil {
		panic(err)
	}
	return m.GetGauge().GetValue()
}

// TestHealthMeansNotStuck pins what /healthz answers: a streaming
// loop that beats, and progress between sessions, are healthy however
// long they last; a loop silent for LoopSilence, or no progress for
// UnhealthyAfter, is stuck.
func TestHealthMeansNotStuck(t *testing.T) {
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "g"})
	h := &Health{UnhealthyAfter: time.Hour, LoopSilence: time.Hour, Gauge: g}
	h.Set(false, "starting", "")
	h.Busy()
	if err := h.Healthy(); err != nil {
		t.Fatalf("a pipeline that just started: %v", err)
	}
	if ready, detail := h.Ready(); ready || detail != "starting" {
		t.Fatalf("Ready() = %v, %q", ready, detail)
	}

	// The session streams, and its loop has not run a round yet: its beat
	// is zero (pipeline tests caught /healthz failing right then, "not run
	// for 498820h").
	var beat time.Time
	h.Streaming(func() time.Time { return beat })
	if err := h.Healthy(); err != nil {
		t.Fatalf("a session that just began streaming, before its loop's first round: %v", err)
	}
	beat = time.Now()
	h.Set(true, "streaming", "")
	if err := h.Healthy(); err != nil || value(g) != 1 {
		t.Fatalf("a streaming loop that beats: %v, gauge %v", err, value(g))
	}
	h.LoopSilence = time.Millisecond
	beat = time.Now().Add(-time.Second)
	if err := h.Healthy(); err == nil || !strings.Contains(err.Error(), "replication loop has not run") {
		t.Fatalf("a loop silent for a second past a millisecond's limit: %v", err)
	}

	h.Streaming(nil) // the session ended: progress
	h.Set(false, "reconnecting after an error", "refused")
	if err := h.Healthy(); err != nil || value(g) != 0 || h.Why() != "refused" {
		t.Fatalf("just after a session: %v, gauge %v, why %q", err, value(g), h.Why())
	}
	h.UnhealthyAfter = time.Millisecond
	h.idleSince.Store(time.Now().Add(-time.Second).UnixNano())
	if err := h.Healthy(); err == nil || !strings.Contains(err.Error(), "not streaming for") || !strings.Contains(err.Error(), "reconnecting") {
		t.Fatalf("no progress for a second past a millisecond's limit: %v", err)
	}
	h.Busy() // a backfill's chunk
	if err := h.Healthy(); err != nil {
		t.Fatalf("right after progress: %v", err)
	}
}
