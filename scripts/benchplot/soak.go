package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"image/color"
	"os"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// soakLine is one line of a soak's history (scripts/netchaos, make soak):
// a sample a second, or a fault.
type soakLine struct {
	At        float64    `json:"t"`
	Kind      string     `json:"kind"`
	PerSecond float64    `json:"events_per_s"`
	BehindS   float64    `json:"behind_s"`
	LagBytes  float64    `json:"lag_bytes"`
	RSSMB     [2]float64 `json:"rss_mb"`
	Fault     string     `json:"fault"`
	Seconds   float64    `json:"seconds"`
}

// soakPlot draws a soak's history as three panels on one time axis:
// events a second read, how far behind the newest event read was, and
// each replica's RSS, with every fault a shaded span and a number that
// the report's fault table lists in the same order.
func soakPlot(history, out string) error {
	samples, faults, err := readSoak(history)
	if err != nil {
		return err
	}
	var plots [][]*plot.Plot
	for _, pn := range []struct {
		title, y string
		series   []soakSeries
	}{
		{"events a second read (first copies); faults shaded, numbered as in the report", "events/s",
			[]soakSeries{{"events/s", func(l soakLine) float64 { return l.PerSecond }}}},
		{"how far behind the newest event read is", "seconds",
			[]soakSeries{{"behind", func(l soakLine) float64 { return l.BehindS }}}},
		{"RSS of each replica", "MB", []soakSeries{
			{"replica 0", func(l soakLine) float64 { return l.RSSMB[0] }},
			{"replica 1", func(l soakLine) float64 { return l.RSSMB[1] }},
		}},
	} {
		p, err := soakPanel(pn.title, pn.y, pn.series, samples, faults)
		if err != nil {
			return err
		}
		plots = append(plots, []*plot.Plot{p})
	}
	const w, h = 10 * vg.Inch, 9 * vg.Inch
	img := vgimg.New(w, h)
	canvases := plot.Align(plots, draw.Tiles{Rows: len(plots), Cols: 1, PadY: vg.Points(6)}, draw.New(img))
	for i := range plots {
		plots[i][0].Draw(canvases[i][0])
	}
	o, err := os.Create(out)
	if err != nil {
		return err
	}
	defer o.Close()
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(o); err != nil {
		return err
	}
	return o.Close()
}

// readSoak reads a soak's history: its samples and its faults.
func readSoak(history string) (samples, faults []soakLine, err error) {
	f, err := os.Open(history)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var l soakLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return nil, nil, fmt.Errorf("%s: %v", history, err)
		}
		if l.Kind == "fault" {
			faults = append(faults, l)
		} else {
			samples = append(samples, l)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, nil, err
	}
	if len(samples) == 0 {
		return nil, nil, fmt.Errorf("%s: no samples", history)
	}
	return samples, faults, nil
}

// soakSeries is one line of a soak panel: its name and its value.
type soakSeries struct {
	name string
	v    func(soakLine) float64
}

// soakPanel plots series over the samples, with the faults shaded and
// numbered.
func soakPanel(title, y string, series []soakSeries, samples, faults []soakLine) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title
	p.Y.Label.Text = y
	p.X.Label.Text = "seconds"
	p.Legend.Top, p.Legend.Left = true, true
	top := 1.0
	for _, s := range series {
		for _, sm := range samples {
			top = max(top, s.v(sm))
		}
	}
	for i, ft := range faults {
		span, err := plotter.NewPolygon(plotter.XYs{{X: ft.At, Y: 0}, {X: ft.At + max(ft.Seconds, 1), Y: 0},
			{X: ft.At + max(ft.Seconds, 1), Y: top}, {X: ft.At, Y: top}})
		if err != nil {
			return nil, err
		}
		span.Color = color.NRGBA{R: 0xe0, G: 0x40, B: 0x40, A: 0x40}
		span.LineStyle.Color = color.Transparent
		p.Add(span)
		lbl, err := plotter.NewLabels(plotter.XYLabels{XYs: plotter.XYs{{X: ft.At, Y: top}}, Labels: []string{fmt.Sprint(i + 1)}})
		if err != nil {
			return nil, err
		}
		p.Add(lbl)
	}
	for i, s := range series {
		pts := make(plotter.XYs, 0, len(samples))
		for _, sm := range samples {
			pts = append(pts, plotter.XY{X: sm.At, Y: s.v(sm)})
		}
		l, err := plotter.NewLine(pts)
		if err != nil {
			return nil, err
		}
		l.Color = palette[i%len(palette)]
		l.Width = vg.Points(0.8)
		p.Add(l)
		if len(series) > 1 {
			p.Legend.Add(s.name, l)
		}
	}
	p.Add(plotter.NewGrid())
	return p, nil
}
