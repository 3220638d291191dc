package testenv

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Counter is the value of the counter (or gauge) name whose label is
// value, as g exports it; 0 when there is no such series.
func Counter(t testing.TB, g prometheus.Gatherer, name, label, value string) float64 {
	t.Helper()
	fams, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					if c := m.GetCounter(); c != nil {
						return c.GetValue()
					}
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	return 0
}

// Value is the value of an unlabelled counter or gauge name in g, 0 if it
// has none.
func Value(t testing.TB, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	fams, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name || len(f.GetMetric()) == 0 {
			continue
		}
		m := f.GetMetric()[0]
		if c := m.GetCounter(); c != nil {
			return c.GetValue()
		}
		return m.GetGauge().GetValue()
	}
	return 0
}
