package delivery

import (
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/outboxcdc/cdc/internal/metrics"
)

// StallAfter is how long Kafka may leave events unacknowledged before
// WatchAcks says so.
const StallAfter = 10 * time.Second

// WatchAcks reports tr once a second until done: the events in flight and how
// far behind the stream is (cdc_in_flight_events, cdc_behind_seconds), and
// one line when Kafka stops acknowledging events in flight (naming
// brokers) and one when it resumes. It only reads the tracker.
func WatchAcks(tr *Tracker, m *metrics.Metrics, log hclog.Logger, brokers string, done <-chan struct{}) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	lastAcked, lastProgress, stalled := tr.Acked(), time.Now(), false
	for {
		select {
		case <-done:
			return
		case now := <-t.C:
			acked, inFlight := tr.Acked(), tr.InFlight()
			m.InFlight.Set(float64(inFlight))
			m.Behind.Set(tr.Behind(now).Seconds())
			switch {
			case acked != lastAcked || inFlight == 0:
				if stalled {
					log.Info("kafka acknowledges events again", "stalled_for", now.Sub(lastProgress).Round(time.Second).String())
				}
				lastAcked, lastProgress, stalled = acked, now, false
			case !stalled && now.Sub(lastProgress) >= StallAfter:
				log.Warn("kafka has not acknowledged any event recently; retrying, and still answering postgres keepalives",
					"for", now.Sub(lastProgress).Round(time.Second).String(), "in_flight", inFlight, "brokers", brokers)
				stalled = true
			}
		}
	}
}
