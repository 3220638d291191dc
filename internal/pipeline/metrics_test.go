package pipeline_test

import (
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/outboxcdc/cdc/internal/config"
	"github.com/outboxcdc/cdc/internal/metrics"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/pipeline"
	"github.com/outboxcdc/cdc/internal/postgres"
	registry "github.com/outboxcdc/cdc/internal/schema"
	"github.com/outboxcdc/cdc/internal/sink"
)

// TestLabelledSeriesExistBeforeAnyEvent (issue 23, item 5): every labelled
// series the configuration makes known is exported at 0 before the first
// event, so that increase() has a series and absent() does not fire.
func TestLabelledSeriesExistBeforeAnyEvent(t *testing.T) {
	cfg := config.Config{
		Postgres: postgres.Config{URL: "postgres://cdc@127.0.0.1:1/app"},
		Kafka:    sink.Config{Brokers: []string{"127.0.0.1:1"}},
		Tables: []*outbox.Source{
			{Name: outbox.TableName{Schema: "public", Name: "outbox"}, Columns: outbox.DefaultColumns, OnInvalid: outbox.OnInvalidDeadLetter},
			{Name: outbox.TableName{Schema: "billing", Name: "events"}, Columns: outbox.DefaultColumns, Topic: "billing.events",
				Schema: outbox.Schema{Format: outbox.SchemaAvro}},
		},
		SchemaRegistry: registry.Config{URL: "http://127.0.0.1:1"},
	}
	p, err := pipeline.New(cfg, hclog.NewNullLogger(), pipeline.Options{})
	if err != nil {
		t.Fatal(err)
	}
	fams, err := p.Metrics().Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	series := map[string]bool{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			key := f.GetName()
			for _, l := range m.GetLabel() {
				// Every series carries pipeline=<name> (issue 26); the
				// series this test looks for are told apart by the rest.
				if l.GetName() == metrics.PipelineLabel {
					continue
				}
				key += " " + l.GetName() + "=" + l.GetValue()
			}
			if strings.HasPrefix(key, "cdc_") && m.GetCounter() != nil && m.GetCounter().GetValue() != 0 {
				t.Errorf("%s is %v before any event", key, m.GetCounter().GetValue())
			}
			series[key] = true
		}
	}
	for _, want := range []string{
		"cdc_dead_letters_total source=public.outbox",
		"cdc_dead_letters_total source=billing.events",
		"cdc_events_total source=billing.events topic=billing.events",
		"cdc_events_total source=public.outbox topic=outbox.dead-letter",
		"cdc_backfill_rows_total table=public.outbox",
		"cdc_events_filtered_total table=public.outbox",
		"cdc_events_filtered_total table=billing.events",
		"cdc_schema_invalid_total source=billing.events",
		"cdc_schema_lookups_total result=error",
		"cdc_schema_lookups_total result=cached",
	} {
		if !series[want] {
			t.Errorf("no series %s before the first event", want)
		}
	}
}
