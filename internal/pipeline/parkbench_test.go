package pipeline_test

import (
	"fmt"
	"sync/atomic"
	"testing"
)

// parkRuns counts BenchmarkParked's runs in this process (-count).
var parkRuns atomic.Int64

// BenchmarkParked drains the same 1-row-transaction backlog twice in one
// run: with nothing parked, and after 50 keys parked (issue 48: at least
// 0.9 of the drain's speed). The backlog of the second starts with an
// event over max_message_bytes for each of 50 keys of their own, so every
// event after them is looked up among 50 parked keys (100 until a parking
// recorded its runs: at a 128 KB max_message_bytes, the checkpoint's half
// holds 98 now); the backlog's own
// keys are not parked, and both drains produce the same records to the
// events' topic. The two take turns at going first, run by run.
func BenchmarkParked(b *testing.B) {
	parking := settings{table: "    on_invalid: park\n", kafka: "  max_message_bytes: 131072\n", signing: true}
	parked := `INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
		SELECT 'order', 'parked-' || i, 'OrderCreated', jsonb_build_object('i', i, 'pad', repeat('x', 135000)) FROM generate_series(1, 50) i`
	for i := 0; i < b.N; i++ {
		events := benchEvents()
		var plain, p drained
		if parkRuns.Add(1)%2 == 1 {
			plain = drainBacklog(b, backlog{events: events, per: 1, set: parking})
			p = drainBacklog(b, backlog{events: events, per: 1, set: parking, pre: parked})
		} else {
			p = drainBacklog(b, backlog{events: events, per: 1, set: parking, pre: parked})
			plain = drainBacklog(b, backlog{events: events, per: 1, set: parking})
		}
		share := plain.elapsed.Seconds() / p.elapsed.Seconds()
		b.ReportMetric(share, "parked/none")
		fmt.Printf("\ndrain %d events in 1-row transactions (%s), with nothing parked and with 50 keys parked:\n", events, brokerName())
		fmt.Printf("  none parked: %7.3f s  %8.0f events/s  cpu %.2f s  (pg_recvlogical %.3f s)\n", plain.elapsed.Seconds(), float64(events)/plain.elapsed.Seconds(), plain.cpu.Seconds(), plain.ref.Seconds())
		fmt.Printf("  50 parked:   %7.3f s  %8.0f events/s  cpu %.2f s  (pg_recvlogical %.3f s)  peak RSS %.1f MB\n", p.elapsed.Seconds(), float64(events)/p.elapsed.Seconds(), p.cpu.Seconds(), p.ref.Seconds(), p.rss)
		fmt.Printf("  50 parked / none parked speed: %.2f\n\n", share)
		benchResult{Bench: "parked", Broker: brokerName(), Events: events, TxSize: 1, Seconds: p.elapsed.Seconds(),
			RefSecs: plain.elapsed.Seconds(), Ratio: share, CPU: p.cpu.Seconds(), RSSMB: p.rss,
			CPUSeconds: map[string]float64{"none": plain.cpu.Seconds()}}.save(b)
	}
}
