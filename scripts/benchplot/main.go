// Command benchplot draws the plots of docs/benchmarks.md from the JSON
// lines make bench writes (CDC_BENCH_OUT), and prints the table of medians:
//
//	go run ./scripts/benchplot docs/bench/results.jsonl docs/bench
//
// It draws latency-cdf.png (commit → visible, one line per run) and
// drain-ratio.png (cdc's drain speed over pg_recvlogical's, per run and the
// median, per transaction size).
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
}

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: benchplot RESULTS.jsonl OUTDIR")
		os.Exit(2)
	}
	rs, err := read(os.Args[1])
	if err != nil {
		fmt.Fprintf(os.Stderr, "benchplot: %v\n", err)
		os.Exit(1)
	}
	var drains, lats, backfills []result
	for _, r := range rs {
		switch r.Bench {
		case "drain":
			drains = append(drains, r)
		case "latency":
			lats = append(lats, r)
		case "backfill":
			backfills = append(backfills, r)
		}
	}
	table(drains, lats)
	backfillTable(backfills)
	if len(lats) > 0 {
		if err := latencyCDF(lats, filepath.Join(os.Args[2], "latency-cdf.png")); err != nil {
			fmt.Fprintf(os.Stderr, "benchplot: %v\n", err)
			os.Exit(1)
		}
	}
	if len(drains) > 0 {
		if err := drainRatio(drains, filepath.Join(os.Args[2], "drain-ratio.png")); err != nil {
			fmt.Fprintf(os.Stderr, "benchplot: %v\n", err)
			os.Exit(1)
		}
	}
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
func backfillTable(runs []result) {
	if len(runs) == 0 {
		return
	}
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
	fmt.Printf("| %d rows, first start | %d | %.2f | %.0f | %.2f | %.2f | %.2f | %.1f |\n", runs[0].Events, len(runs),
		col(func(r result) float64 { return r.Seconds }), col(func(r result) float64 { return float64(r.Events) / r.Seconds }),
		col(func(r result) float64 { return r.RefSecs }), col(func(r result) float64 { return r.Ratio }),
		col(func(r result) float64 { return r.CPU }), col(func(r result) float64 { return r.RSSMB }))
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
	bySize := map[int][]float64{}
	for _, r := range drains {
		bySize[r.TxSize] = append(bySize[r.TxSize], r.Ratio)
	}
	sizes := keys(bySize)
	p := plot.New()
	p.Title.Text = "drain speed: cdc (to Postgres's confirm) / pg_recvlogical"
	p.Y.Label.Text = "ratio (higher is faster)"
	p.Y.Min = 0
	var medians plotter.Values
	var names []string
	var dots plotter.XYs
	for i, n := range sizes {
		medians = append(medians, median(bySize[n]))
		names = append(names, fmt.Sprintf("%d-row transactions", n))
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
	for _, y := range []float64{0.95, 1} {
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
