package metrics

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// names are the metric names the registry exposes, histograms with their
// series suffixes.
func names(t *testing.T) map[string]bool {
	t.Helper()
	m := New("orders")
	m.EventCounter("s", "t").Inc()
	m.DeadLetter("s")
	m.BackfillRows("t").Inc()
	m.SchemaInvalid("s")
	m.SchemaLookups.WithLabelValues("cached").Inc()
	m.RefusedRequests.WithLabelValues("redrive").Inc()
	m.Unmapped("r")
	m.TableRepaired("t")
	m.TableMissing("t", false)
	m.TableRenamed("t", false)
	m.Filtered("t").Inc()
	m.Parked("t", 1)
	m.SetWALStatus("reserved")
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, f := range fams {
		out[f.GetName()] = true
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			out[f.GetName()+suffix] = true
		}
	}
	return out
}

var metricRE = regexp.MustCompile(`\bcdc_[a-z_]+`)

// TestEverySeriesCarriesThePipeline: every series, Go's and the process's
// too, has pipeline="<name>", so that a fleet of connectors shares one
// dashboard.
func TestEverySeriesCarriesThePipeline(t *testing.T) {
	m := New("orders-db")
	m.EventCounter("s", "t").Inc()
	m.SetWALStatus("reserved")
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range fams {
		for _, s := range f.GetMetric() {
			n++
			found := false
			for _, l := range s.GetLabel() {
				found = found || l.GetName() == PipelineLabel && l.GetValue() == "orders-db"
			}
			if !found {
				t.Errorf("a series of %s has no pipeline=\"orders-db\" label: %v", f.GetName(), s.GetLabel())
			}
		}
	}
	if n < 20 {
		t.Fatalf("gathered %d series", n)
	}
}

// TestMonitoringExamplesUseRealMetrics: every cdc_ metric in the alert rules,
// the dashboard and docs/metrics.md exists, and every metric is documented.
func TestMonitoringExamplesUseRealMetrics(t *testing.T) {
	have := names(t)
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	raw, err := os.ReadFile("../../examples/monitoring/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(raw, &rules); err != nil || len(rules.Groups) == 0 || len(rules.Groups[0].Rules) < 5 {
		t.Fatalf("alerts.yml: %v", err)
	}
	check := func(where, text string) {
		for _, n := range metricRE.FindAllString(text, -1) {
			if !have[n] {
				t.Errorf("%s uses %s, which the connector does not export", where, n)
			}
		}
	}
	for _, r := range rules.Groups[0].Rules {
		check("alert "+r.Alert, r.Expr)
	}
	raw, err = os.ReadFile("../../examples/monitoring/grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Templating struct {
			List []struct {
				Name  string          `json:"name"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil || len(dash.Panels) < 5 {
		t.Fatalf("grafana-dashboard.json: %v", err)
	}
	// The fleet: a pipeline selector, which every query honours and keeps
	// apart, and alerts that fire per pipeline.
	selector := false
	for _, v := range dash.Templating.List {
		selector = selector || v.Name == PipelineLabel && strings.Contains(string(v.Query), "label_values(cdc_streaming, pipeline)")
	}
	if !selector {
		t.Error("the dashboard has no pipeline variable")
	}
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			check("panel "+p.Title, tg.Expr)
			if !strings.Contains(tg.Expr, `{pipeline=~"$pipeline"}`) || !strings.Contains(tg.Expr, "by (pipeline") {
				t.Errorf("panel %s: %s neither selects nor keeps the pipeline", p.Title, tg.Expr)
			}
		}
	}
	for _, r := range rules.Groups[0].Rules {
		if !strings.Contains(r.Expr, "by (pipeline") {
			t.Errorf("alert %s: %s does not fire per pipeline", r.Alert, r.Expr)
		}
	}
	doc, err := os.ReadFile("../../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	check("docs/metrics.md", string(doc))
	for n := range have {
		if strings.HasPrefix(n, "cdc_") && !strings.HasSuffix(n, "_bucket") && !strings.HasSuffix(n, "_sum") && !strings.HasSuffix(n, "_count") &&
			!strings.Contains(string(doc), "`"+n) {
			t.Errorf("%s is not documented in docs/metrics.md", n)
		}
	}
}

// TestUnmappedRelationsBounded: a role that may create tables in a FOR ALL
// TABLES publication makes cdc_unmapped_relation_changes_total count
// inserts into as many relations as it likes, but its series stay at
// MaxUnmappedRelations plus the one of the others, and every insert is
// counted.
func TestUnmappedRelationsBounded(t *testing.T) {
	m := New("orders")
	for i := 0; i < 1000; i++ {
		m.Unmapped(fmt.Sprintf("public.t%d", i%500))
	}
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	series, total, others := 0, 0.0, 0.0
	for _, f := range fams {
		if f.GetName() != "cdc_unmapped_relation_changes_total" {
			continue
		}
		for _, s := range f.GetMetric() {
			series++
			total += s.GetCounter().GetValue()
			for _, l := range s.GetLabel() {
				if l.GetName() == "relation" && l.GetValue() == UnmappedOthers {
					others = s.GetCounter().GetValue()
				}
			}
		}
	}
	if series != MaxUnmappedRelations+1 || total != 1000 || others != 1000-2*MaxUnmappedRelations {
		t.Fatalf("%d series counting %v inserts (%v under %s); want %d series counting all 1000", series, total, others, UnmappedOthers, MaxUnmappedRelations+1)
	}
}
