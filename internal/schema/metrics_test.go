package schema

import (
	"testing"

	"github.com/outboxcdc/cdc/internal/metrics"
)

// testutilCount is cdc_schema_lookups_total{result}'s value.
func testutilCount(t *testing.T, m *metrics.Metrics, name, result string) float64 {
	t.Helper()
	return testutilSeries(t, m, name, "result", result)
}

// testutilSeries is the value of the series of name whose label is value.
func testutilSeries(t *testing.T, m *metrics.Metrics, name, label, value string) float64 {
	t.Helper()
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, s := range mf.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return s.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}
