package pipeline_test

import (
	"fmt"
	"sync/atomic"
	"testing"
)

// exprRuns counts BenchmarkExpressions' runs in this process (-count).
var exprRuns atomic.Int64

// BenchmarkExpressions drains the same 1-row-transaction backlog twice in
// one run: as configured by default, and with a filter and a key
// expression that read the payload (issue 49: at least 0.9 of the plain
// drain's speed). The filter keeps every event, so that both produce the
// same records, and the key is the template's own (agg-<i % 1000>). The
// two take turns at going first, run by run: on this box the second of a
// pair was often the faster.
func BenchmarkExpressions(b *testing.B) {
	exprs := settings{table: "    filter: 'payload.i >= 0'\n    expressions: {key: '\"agg-\" + string(payload.i % 1000)'}\n"}
	for i := 0; i < b.N; i++ {
		events := benchEvents()
		var plain, x drained
		if exprRuns.Add(1)%2 == 1 {
			plain = drain(b, 1, "")
			x = drainBacklog(b, backlog{events: events, per: 1, set: exprs})
		} else {
			x = drainBacklog(b, backlog{events: events, per: 1, set: exprs})
			plain = drain(b, 1, "")
		}
		share := plain.elapsed.Seconds() / x.elapsed.Seconds()
		b.ReportMetric(share, "expr/plain")
		fmt.Printf("\ndrain %d events in 1-row transactions (%s), with and without expressions:\n", events, brokerName())
		fmt.Printf("  plain:      %7.3f s  %8.0f events/s  cpu %.2f s  (pg_recvlogical %.3f s)\n", plain.elapsed.Seconds(), float64(events)/plain.elapsed.Seconds(), plain.cpu.Seconds(), plain.ref.Seconds())
		fmt.Printf("  filter+key: %7.3f s  %8.0f events/s  cpu %.2f s  (pg_recvlogical %.3f s)  peak RSS %.1f MB\n", x.elapsed.Seconds(), float64(events)/x.elapsed.Seconds(), x.cpu.Seconds(), x.ref.Seconds(), x.rss)
		fmt.Printf("  filter+key / plain speed: %.2f\n\n", share)
		benchResult{Bench: "expressions", Broker: brokerName(), Events: events, TxSize: 1, Seconds: x.elapsed.Seconds(),
			RefSecs: plain.elapsed.Seconds(), Ratio: share, CPU: x.cpu.Seconds(), RSSMB: x.rss,
			CPUSeconds: map[string]float64{"plain": plain.cpu.Seconds()}}.save(b)
	}
}
