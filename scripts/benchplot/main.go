// Command benchplot draws the plots of docs/benchmarks.md from the JSON
// lines make bench writes (CDC_BENCH_OUT), and prints the table of medians:
//
//	go run ./scripts/benchplot docs/bench/results.jsonl docs/bench
//	go run ./scripts/benchplot soak history.jsonl soak.png
//
// It draws latency-cdf.png (commit → visible, one line per run),
// drain-ratio.png (cdc's drain speed over pg_recvlogical's, per run and the
// median, per transaction size), payload-ratio.png (the same per payload
// size), sweep-latency.png (p50 and p99 against the offered rate) and
// sweep-cpu.png (each process's CPU against the rate). With soak, it draws
// a soak's history (make soak): events a second, how far behind, RSS, and
// the faults.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"image/color"
	"os"
	"path/filepath"
	"slices"
	"sort"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// result mirrors internal/pipeline's benchResult.
type result struct {
	Bench      string    `json:"bench"`
	Broker     string    `json:"broker"`
	Events     int       `json:"events"`
	TxSize     int       `json:"tx_size"`
	Rate       float64   `json:"rate"`
	Seconds    float64   `json:"seconds"`
	RefSecs    float64   `json:"ref_seconds"`
	Ratio      float64   `json:"ratio"`
	CPU        float64   `json:"cpu_seconds"`
	RSSMB      float64   `json:"peak_rss_mb"`
	Latency    []float64 `json:"latency_ms"`
	PerRequest float64   `json:"events_per_request"`

	FloorP99     float64            `json:"floor_p99_ms"`
	PayloadBytes int                `json:"payload_bytes"`
	Reached      float64            `json:"reached"`
	CPUPercent   map[string]float64 `json:"cpu_percent"`
	Stages       map[string]float64 `json:"stages_ms"`
	CPUSeconds   map[string]float64 `json:"other_cpu_seconds"`
	Delivery     string             `json:"delivery"`
	NetMS        float64            `json:"net_latency_ms"`
}

func main() {
	if len(os.Args) == 4 && os.Args[1] == "soak" {
		// benchplot soak HISTORY.jsonl OUT.png (make soak)
		if err := soakPlot(os.Args[2], os.Args[3]); err != nil {
			fmt.Fprintf(os.Stderr, "benchplot: %v\n", err)
			os.Exit(1)
		}
		return
	}
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: benchplot RESULTS.jsonl OUTDIR")
		os.Exit(2)
	}
	rs, err := read(os.Args[1])
	if err != nil {
		fmt.Fprintf(os.Stderr, "benchplot: %v\n", err)
		os.Exit(1)
	}
	by := map[string][]result{}
	for _, r := range rs {
		by[r.Bench] = append(by[r.Bench], r)
	}
	drains, lats, payloads, sweeps := by["drain"], by["latency"], by["payload"], by["sweep"]
	table(drains, lats)
	payloadTable(payloads)
	sweepTable(sweeps)
	floorTable(append(append([]result(nil), lats...), sweeps...))
	startupTable(by["startup"])
	pairTable(by["exactly-once"], "exactly-once drain", "at-least-once", "exactly-once")
	pairTable(by["schema-avro"], "schema drain", "json", "avro")
	pairTable(by["expressions"], "expressions drain", "plain", "filter+key")
	backfillTable(by["backfill"])
	networkTable(by["network-drain"], by["network-latency"])
	out := os.Args[2]
	for _, plot := range []struct {
		runs []result
		draw func([]result, string) error
		file string
	}{
		{lats, latencyCDF, "latency-cdf.png"},
		{drains, drainRatio, "drain-ratio.png"},
		{payloads, payloadRatio, "payload-ratio.png"},
		{sweeps, sweepLatency, "sweep-latency.png"},
		{sweeps, sweepCPU, "sweep-cpu.png"},
	} {
		if len(plot.runs) == 0 {
			continue
		}
		if err := plot.draw(plot.runs, filepath.Join(out, plot.file)); err != nil {
			fmt.Fprintf(os.Stderr, "benchplot: %s: %v\n", plot.file, err)
			os.Exit(1)
		}
	}
}

// medianOf is the median of f over runs.
func medianOf(runs []result, f func(result) float64) float64 {
	var v []float64
	for _, r := range runs {
		v = append(v, f(r))
	}
	return median(v)
}

// payloadTable prints the large-payload drains' medians, per size.
func payloadTable(runs []result) {
	bySize := map[int][]result{}
	for _, r := range runs {
		bySize[r.PayloadBytes] = append(bySize[r.PayloadBytes], r)
	}
	if len(bySize) == 0 {
		return
	}
	fmt.Println()
	fmt.Println("| payload drain | runs | cdc (s) | MB/s | pg_recvlogical (s) | ratio | CPU (s) | peak RSS (MB) |")
	fmt.Println("|---|---|---|---|---|---|---|---|")
	for _, size := range keys(bySize) {
		rs := bySize[size]
		fmt.Printf("| %d events of %s | %d | %.2f | %.1f | %.2f | %.2f | %.2f | %.1f |\n", rs[0].Events, sizeName(size), len(rs),
			medianOf(rs, func(r result) float64 { return r.Seconds }),
			medianOf(rs, func(r result) float64 { return float64(r.Events) * float64(size) / r.Seconds / 1e6 }),
			medianOf(rs, func(r result) float64 { return r.RefSecs }), medianOf(rs, func(r result) float64 { return r.Ratio }),
			medianOf(rs, func(r result) float64 { return r.CPU }), medianOf(rs, func(r result) float64 { return r.RSSMB }))
	}
}

func sizeName(bytes int) string {
	switch {
	case bytes >= 1_000_000:
		return fmt.Sprintf("%g MB", float64(bytes)/1e6)
	case bytes >= 1000:
		return fmt.Sprintf("%g KB", float64(bytes)/1e3)
	}
	return fmt.Sprintf("%d B", bytes)
}

// processes are the CPU columns of the sweep, in order.
var processes = []string{"connector", "walsender", "writer", "broker"}

// sweepTable prints the rate sweep's medians, per offered rate.
func sweepTable(runs []result) {
	byRate := groupByRate(runs)
	if len(byRate) == 0 {
		return
	}
	fmt.Println()
	fmt.Println("| offered (events/s) | runs | reached | p50 (ms) | p90 (ms) | p99 (ms) | max (ms) | events per request | CPU % connector | walsender | writer | broker |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, rate := range keys(byRate) {
		rs := byRate[rate]
		fmt.Printf("| %d (%d-row tx) | %d | %.0f | %.1f | %.1f | %.1f | %.1f | %.1f |", rate, rs[0].TxSize, len(rs),
			medianOf(rs, func(r result) float64 { return r.Reached }),
			medianOf(rs, func(r result) float64 { return quantile(r, 0.5) }), medianOf(rs, func(r result) float64 { return quantile(r, 0.9) }),
			medianOf(rs, func(r result) float64 { return quantile(r, 0.99) }), medianOf(rs, func(r result) float64 { return quantile(r, 1) }),
			medianOf(rs, func(r result) float64 { return r.PerRequest }))
		for _, name := range processes {
			if _, ok := rs[0].CPUPercent[name]; !ok {
				fmt.Print(" – |")
				continue
			}
			fmt.Printf(" %.0f |", medianOf(rs, func(r result) float64 { return r.CPUPercent[name] }))
		}
		fmt.Println()
	}
}

// floorTable prints, run by run, each latency run's p99 beside the floor
// measured after it in the same database (pg_recvlogical alone, the
// same writer at the same rate), and how far above the floor it is:
// issue 56 holds it within 10 ms.
func floorTable(runs []result) {
	var with []result
	for _, r := range runs {
		if r.FloorP99 > 0 {
			with = append(with, r)
		}
	}
	if len(with) == 0 {
		return
	}
	fmt.Println()
	fmt.Println("| commit → visible, run by run | p99 (ms) | floor's p99 (ms) | above the floor (ms) | within 10 ms |")
	fmt.Println("|---|---|---|---|---|")
	n := map[string]int{}
	for _, r := range with {
		what := fmt.Sprintf("%d events/s, %d-row tx", int(r.Rate), r.TxSize)
		n[what]++
		over := quantile(r, 0.99) - r.FloorP99
		yes := "yes"
		switch {
		case over < 0:
			// pg_recvlogical alone slower than the connector: it fell
			// behind the writer (above 20k events/s here), no floor.
			yes = "— (the floor fell behind)"
		case over > 10:
			yes = "no"
		}
		fmt.Printf("| %s, run %d | %.1f | %.1f | %+.1f | %s |\n", what, n[what], quantile(r, 0.99), r.FloorP99, over, yes)
	}
}

// startupTable prints the start-up timeline's medians, stage by stage, in
// the order they were reached.
func startupTable(runs []result) {
	if len(runs) == 0 {
		return
	}
	type stage struct {
		name string
		ms   float64
	}
	var stages []stage
	for name := range runs[0].Stages {
		stages = append(stages, stage{name, medianOf(runs, func(r result) float64 { return r.Stages[name] })})
	}
	stages = append(stages,
		stage{"event visible to a consumer", medianOf(runs, func(r result) float64 { return r.Seconds * 1000 })},
		stage{"confirmed to Postgres", medianOf(runs, func(r result) float64 { return r.RefSecs * 1000 })})
	sort.SliceStable(stages, func(i, j int) bool { return stages[i].ms < stages[j].ms })
	fmt.Println()
	fmt.Printf("| start-up, ms from the process's start (median of %d) | ms |\n|---|---|\n", len(runs))
	for _, st := range stages {
		fmt.Printf("| %s | %.1f |\n", st.name, st.ms)
	}
}

// pairTable: one backlog drained two ways in each run, the second after
// the first (exactly-once after at-least-once, Avro after JSON);
// ref_seconds is the first way's time, and other_cpu_seconds[first] its
// CPU where it was measured.
func pairTable(runs []result, title, first, second string) {
	if len(runs) == 0 {
		return
	}
	firstCPU := "—"
	if cpu := medianOf(runs, func(r result) float64 { return r.CPUSeconds[first] }); cpu > 0 {
		firstCPU = fmt.Sprintf("%.2f", cpu)
	}
	fmt.Println()
	fmt.Printf("| %s | runs | %s (s) | %s (s) | %s / %s speed | %s CPU (s) | %s CPU (s) | peak RSS (MB) |\n", title, first, second, second, first, first, second)
	fmt.Println("|---|---|---|---|---|---|---|---|")
	fmt.Printf("| %d events, 1-row transactions | %d | %.2f | %.2f | %.2f | %s | %.2f | %.1f |\n", runs[0].Events, len(runs),
		medianOf(runs, func(r result) float64 { return r.RefSecs }), medianOf(runs, func(r result) float64 { return r.Seconds }),
		medianOf(runs, func(r result) float64 { return r.Ratio }), firstCPU,
		medianOf(runs, func(r result) float64 { return r.CPU }), medianOf(runs, func(r result) float64 { return r.RSSMB }))
}

func read(path string) ([]result, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var rs []result
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for line := 1; sc.Scan(); line++ {
		var r result
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return nil, fmt.Errorf("%s line %d: %v", path, line, err)
		}
		rs = append(rs, r)
	}
	return rs, sc.Err()
}

// backfillTable prints the first-start backfill's medians.
func backfillTable(all []result) {
	bySize := map[int][]result{}
	for _, r := range all {
		bySize[r.TxSize] = append(bySize[r.TxSize], r)
	}
	for _, n := range keys(bySize) {
		backfillRuns(bySize[n])
	}
}

// backfillRuns prints the medians of one backlog's backfill runs: written
// in one transaction (TxSize 0) or in TxSize-row ones.
func backfillRuns(runs []result) {
	col := func(f func(result) float64) float64 {
		var v []float64
		for _, r := range runs {
			v = append(v, f(r))
		}
		return median(v)
	}
	fmt.Println()
	fmt.Println("| backfill | runs | cdc (s) | rows/s | psql \\copy (s) | ratio | CPU (s) | peak RSS (MB) |")
	fmt.Println("|---|---|---|---|---|---|---|---|")
	written := "one transaction"
	if runs[0].TxSize > 0 {
		written = fmt.Sprintf("%d-row transactions", runs[0].TxSize)
	}
	fmt.Printf("| %d rows in %s, first start | %d | %.2f | %.0f | %.2f | %.2f | %.2f | %.1f |\n", runs[0].Events, written, len(runs),
		col(func(r result) float64 { return r.Seconds }), col(func(r result) float64 { return float64(r.Events) / r.Seconds }),
		col(func(r result) float64 { return r.RefSecs }), col(func(r result) float64 { return r.Ratio }),
		col(func(r result) float64 { return r.CPU }), col(func(r result) float64 { return r.RSSMB }))
	if runs[0].CPUSeconds["postgres"] == 0 {
		return // recorded before the bench counted the others' CPU
	}
	// Where the CPU went: two cores hold the reader, Postgres and, for
	// cdc, the broker.
	other := func(k string) float64 { return col(func(r result) float64 { return r.CPUSeconds[k] }) }
	fmt.Println()
	fmt.Printf("| backfill CPU (s), medians, %s | reader | Postgres | broker | all | wall × 2 cores |\n", written)
	fmt.Println("|---|---|---|---|---|---|")
	fmt.Printf("| cdc | %.2f | %.2f | %.2f | %.2f | %.2f |\n", col(func(r result) float64 { return r.CPU }), other("postgres"), other("broker"),
		col(func(r result) float64 { return r.CPU + r.CPUSeconds["postgres"] + r.CPUSeconds["broker"] }), 2*col(func(r result) float64 { return r.Seconds }))
	fmt.Printf("| psql \\copy | %.2f | %.2f | — | %.2f | %.2f |\n", other("psql"), other("ref_postgres"),
		col(func(r result) float64 { return r.CPUSeconds["psql"] + r.CPUSeconds["ref_postgres"] }), 2*col(func(r result) float64 { return r.RefSecs }))
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// quantile reads q from a run's 1001-point CDF.
func quantile(r result, q float64) float64 { return r.Latency[int(q*float64(len(r.Latency)-1)+0.5)] }

// table prints the medians over runs, as docs/benchmarks.md shows them.
func table(drains, lats []result) {
	bySize := map[int][]result{}
	for _, r := range drains {
		bySize[r.TxSize] = append(bySize[r.TxSize], r)
	}
	sizes := keys(bySize)
	if len(sizes) > 0 {
		fmt.Println("| drain | runs | cdc (s) | pg_recvlogical (s) | ratio | CPU per 100k events (s) | peak RSS (MB) |")
		fmt.Println("|---|---|---|---|---|---|---|")
	}
	for _, n := range sizes {
		runs := bySize[n]
		col := func(f func(result) float64) float64 {
			var v []float64
			for _, r := range runs {
				v = append(v, f(r))
			}
			return median(v)
		}
		fmt.Printf("| %d events, %d-row transactions | %d | %.2f | %.2f | %.2f | %.2f | %.1f |\n", runs[0].Events, n, len(runs),
			col(func(r result) float64 { return r.Seconds }), col(func(r result) float64 { return r.RefSecs }),
			col(func(r result) float64 { return r.Ratio }),
			col(func(r result) float64 { return r.CPU * 100_000 / float64(r.Events) }), col(func(r result) float64 { return r.RSSMB }))
	}
	byRate := map[int][]result{}
	for _, r := range lats {
		byRate[int(r.Rate)] = append(byRate[int(r.Rate)], r)
	}
	rates := keys(byRate)
	if len(rates) > 0 {
		fmt.Println()
		fmt.Println("| commit → visible | runs | p50 (ms) | p90 (ms) | p99 (ms) | max (ms) | events per request | CPU (s) |")
		fmt.Println("|---|---|---|---|---|---|---|---|")
	}
	for _, rate := range rates {
		runs := byRate[rate]
		col := func(f func(result) float64) float64 {
			var v []float64
			for _, r := range runs {
				v = append(v, f(r))
			}
			return median(v)
		}
		fmt.Printf("| %d events/s | %d | %.1f | %.1f | %.1f | %.1f | %.1f | %.2f |\n", rate, len(runs),
			col(func(r result) float64 { return quantile(r, 0.5) }), col(func(r result) float64 { return quantile(r, 0.9) }),
			col(func(r result) float64 { return quantile(r, 0.99) }), col(func(r result) float64 { return quantile(r, 1) }),
			col(func(r result) float64 { return r.PerRequest }), col(func(r result) float64 { return r.CPU }))
	}
}

func keys[V any](m map[int]V) []int {
	var ks []int
	for k := range m {
		ks = append(ks, k)
	}
	sort.Ints(ks)
	return ks
}

var palette = []color.Color{
	color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
	color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
	color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff},
	color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 0xff},
}

// latencyCDF draws one line per run, one colour per rate, on a log scale.
func latencyCDF(lats []result, out string) error {
	p := plot.New()
	p.Title.Text = "commit → visible to a consumer (real broker, 1-row transactions)"
	p.X.Label.Text = "latency (ms, log scale)"
	p.Y.Label.Text = "fraction of events"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Legend.Top = false
	p.Legend.Left = false
	rateIdx := map[float64]int{}
	for _, r := range lats {
		if _, ok := rateIdx[r.Rate]; !ok {
			rateIdx[r.Rate] = len(rateIdx)
		}
	}
	labelled := map[float64]bool{}
	for _, r := range lats {
		pts := make(plotter.XYs, 0, len(r.Latency))
		for i, v := range r.Latency {
			pts = append(pts, plotter.XY{X: max(v, 0.1), Y: float64(i) / float64(len(r.Latency)-1)})
		}
		l, err := plotter.NewLine(pts)
		if err != nil {
			return err
		}
		l.Color = palette[rateIdx[r.Rate]%len(palette)]
		l.Width = vg.Points(1.2)
		p.Add(l)
		if !labelled[r.Rate] {
			p.Legend.Add(fmt.Sprintf("%.0f events/s", r.Rate), l)
			labelled[r.Rate] = true
		}
	}
	for _, goal := range []struct {
		ms    float64
		label string
	}{{25, "p99 goal at 1k/s"}, {100, "p99 goal at 5k/s"}} {
		g, err := plotter.NewLine(plotter.XYs{{X: goal.ms, Y: 0}, {X: goal.ms, Y: 1}})
		if err != nil {
			return err
		}
		g.Dashes = []vg.Length{vg.Points(3), vg.Points(3)}
		g.Color = color.Gray{Y: 0x80}
		p.Add(g)
	}
	p.Add(plotter.NewGrid())
	return p.Save(7*vg.Inch, 4.5*vg.Inch, out)
}

// drainRatio draws, per transaction size, each run's ratio and a bar at
// the median, with the goal (0.95) and parity (1) as lines.
func drainRatio(drains []result, out string) error {
	return ratioChart(drains, func(r result) int { return r.TxSize },
		func(n int) string { return fmt.Sprintf("%d-row transactions", n) },
		"drain speed: cdc (to Postgres's confirm) / pg_recvlogical", 0.95, out)
}

// payloadRatio is drainRatio per payload size, with the goal 0.9.
func payloadRatio(runs []result, out string) error {
	return ratioChart(runs, func(r result) int { return r.PayloadBytes }, sizeName,
		"large payloads: cdc (to Postgres's confirm) / pg_recvlogical", 0.9, out)
}

func ratioChart(runs []result, key func(result) int, name func(int) string, title string, goal float64, out string) error {
	bySize := map[int][]float64{}
	for _, r := range runs {
		bySize[key(r)] = append(bySize[key(r)], r.Ratio)
	}
	sizes := keys(bySize)
	p := plot.New()
	p.Title.Text = title
	p.Y.Label.Text = "ratio (higher is faster)"
	p.Y.Min = 0
	var medians plotter.Values
	var names []string
	var dots plotter.XYs
	for i, n := range sizes {
		medians = append(medians, median(bySize[n]))
		names = append(names, name(n))
		for _, v := range bySize[n] {
			dots = append(dots, plotter.XY{X: float64(i), Y: v})
		}
	}
	bars, err := plotter.NewBarChart(medians, vg.Points(60))
	if err != nil {
		return err
	}
	bars.Color = palette[0]
	bars.LineStyle.Width = 0
	p.Add(bars)
	sc, err := plotter.NewScatter(dots)
	if err != nil {
		return err
	}
	sc.GlyphStyle.Shape = draw.CircleGlyph{}
	sc.GlyphStyle.Color = color.Black
	p.Add(sc)
	for _, y := range []float64{goal, 1} {
		l, err := plotter.NewLine(plotter.XYs{{X: -0.5, Y: y}, {X: float64(len(sizes)) - 0.5, Y: y}})
		if err != nil {
			return err
		}
		l.Dashes = []vg.Length{vg.Points(3), vg.Points(3)}
		l.Color = color.Gray{Y: 0x80}
		p.Add(l)
	}
	p.NominalX(names...)
	p.Legend.Add("median of runs", bars)
	p.Legend.Add("one run", sc)
	p.Legend.Top = true
	return p.Save(5*vg.Inch, 4*vg.Inch, out)
}

// groupByRate groups runs by their offered rate.
func groupByRate(runs []result) map[int][]result {
	byRate := map[int][]result{}
	for _, r := range runs {
		byRate[int(r.Rate)] = append(byRate[int(r.Rate)], r)
	}
	return byRate
}

// ratePlot is a plot against the offered rate, on a log scale.
func ratePlot(title, yLabel string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "offered rate (events/s, log scale)"
	p.Y.Label.Text = yLabel
	p.X.Scale, p.X.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	p.Legend.Top, p.Legend.Left = true, true
	return p
}

// sweepLatency draws p50 and p99 against the offered rate, each run a
// dot and the median a line, with the goals (25 ms at 10k/s, 50 ms at
// 20k/s) and the 100 ms bound of the sustained rate.
func sweepLatency(runs []result, out string) error {
	p := ratePlot("commit → visible against the rate (10-row transactions, real broker)", "latency (ms, log scale)")
	p.Y.Scale, p.Y.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	byRate := groupByRate(runs)
	for i, q := range []float64{0.5, 0.99} {
		var line, dots plotter.XYs
		for _, rate := range keys(byRate) {
			rs := byRate[rate]
			line = append(line, plotter.XY{X: float64(rate), Y: max(0.1, medianOf(rs, func(r result) float64 { return quantile(r, q) }))})
			for _, r := range rs {
				dots = append(dots, plotter.XY{X: float64(rate), Y: max(0.1, quantile(r, q))})
			}
		}
		l, sc, err := plotter.NewLinePoints(line)
		if err != nil {
			return err
		}
		l.Color, sc.Color = palette[i], palette[i]
		p.Add(l, sc)
		d, err := plotter.NewScatter(dots)
		if err != nil {
			return err
		}
		d.GlyphStyle.Color, d.GlyphStyle.Radius = palette[i], vg.Points(1.5)
		p.Add(d)
		p.Legend.Add(fmt.Sprintf("p%g (median of runs; dots: runs)", q*100), l, sc)
	}
	goals, err := plotter.NewScatter(plotter.XYs{{X: 10_000, Y: 25}, {X: 20_000, Y: 50}})
	if err != nil {
		return err
	}
	goals.GlyphStyle.Shape, goals.GlyphStyle.Radius, goals.GlyphStyle.Color = draw.CrossGlyph{}, vg.Points(5), color.Black
	p.Add(goals)
	p.Legend.Add("p99 goals", goals)
	lo, hi := float64(keys(byRate)[0]), float64(keys(byRate)[len(byRate)-1])
	bound, err := plotter.NewLine(plotter.XYs{{X: lo, Y: 100}, {X: hi, Y: 100}})
	if err != nil {
		return err
	}
	bound.Dashes, bound.Color = []vg.Length{vg.Points(3), vg.Points(3)}, color.Gray{Y: 0x80}
	p.Add(bound)
	p.Add(plotter.NewGrid())
	return p.Save(7*vg.Inch, 4.5*vg.Inch, out)
}

// sweepCPU draws each process's CPU (% of a core) against the offered
// rate: the connector's below the walsender's says the connector is not
// what limits the rate.
func sweepCPU(runs []result, out string) error {
	p := ratePlot("CPU against the rate (% of one core, median of runs)", "CPU (% of one core)")
	p.Y.Min = 0
	byRate := groupByRate(runs)
	for i, name := range processes {
		var line plotter.XYs
		for _, rate := range keys(byRate) {
			rs := byRate[rate]
			if _, ok := rs[0].CPUPercent[name]; !ok {
				continue
			}
			line = append(line, plotter.XY{X: float64(rate), Y: medianOf(rs, func(r result) float64 { return r.CPUPercent[name] })})
		}
		if len(line) == 0 {
			continue
		}
		l, sc, err := plotter.NewLinePoints(line)
		if err != nil {
			return err
		}
		l.Color, sc.Color = palette[i%len(palette)], palette[i%len(palette)]
		if name == "walsender" {
			l.Width = vg.Points(2.5)
		}
		p.Add(l, sc)
		p.Legend.Add(name, l, sc)
	}
	p.Add(plotter.NewGrid())
	return p.Save(7*vg.Inch, 4.5*vg.Inch, out)
}

// networkTable prints, per delivery mode and latency each way between the
// connector and the broker, the median drain speed, its share of the same
// mode's speed at 0 ms (issue 41's goals: 0.9 at 2 ms, 0.5 at 20 ms), and
// commit → visible at 20,000 events/s.
func networkTable(drains, lats []result) {
	if len(drains) == 0 && len(lats) == 0 {
		return
	}
	type key struct {
		mode string
		ms   float64
	}
	dr, lt := map[key][]result{}, map[key][]result{}
	var keys []key
	seen := map[key]bool{}
	for _, set := range []struct {
		runs []result
		into map[key][]result
	}{{drains, dr}, {lats, lt}} {
		for _, r := range set.runs {
			k := key{r.Delivery, r.NetMS}
			set.into[k] = append(set.into[k], r)
			if !seen[k] {
				seen[k] = true
				keys = append(keys, k)
			}
		}
	}
	slices.SortFunc(keys, func(a, b key) int {
		if a.mode != b.mode {
			if a.mode < b.mode {
				return -1
			}
			return 1
		}
		return int(a.ms - b.ms)
	})
	fmt.Println()
	fmt.Println("| delivery | ms each way | runs | drain (events/s) | share of 0 ms | ratio to pg_recvlogical | p50 at 20k/s (ms) | p99 at 20k/s (ms) | reached (events/s) |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|")
	speed := func(rs []result) float64 {
		return medianOf(rs, func(r result) float64 { return float64(r.Events) / r.Seconds })
	}
	for _, k := range keys {
		share, drain, ratio := "—", "—", "—"
		if rs := dr[k]; len(rs) > 0 {
			drain = fmt.Sprintf("%.0f", speed(rs))
			ratio = fmt.Sprintf("%.2f", medianOf(rs, func(r result) float64 { return r.Ratio }))
			if base := dr[key{k.mode, 0}]; len(base) > 0 {
				share = fmt.Sprintf("%.2f", speed(rs)/speed(base))
			}
		}
		p50, p99, reached := "—", "—", "—"
		if rs := lt[k]; len(rs) > 0 {
			p50 = fmt.Sprintf("%.1f", medianOf(rs, func(r result) float64 { return quantile(r, 0.5) }))
			p99 = fmt.Sprintf("%.1f", medianOf(rs, func(r result) float64 { return quantile(r, 0.99) }))
			reached = fmt.Sprintf("%.0f", medianOf(rs, func(r result) float64 { return r.Reached }))
		}
		fmt.Printf("| %s | %g | %d | %s | %s | %s | %s | %s | %s |\n", k.mode, k.ms, max(len(dr[k]), len(lt[k])), drain, share, ratio, p50, p99, reached)
	}
}
