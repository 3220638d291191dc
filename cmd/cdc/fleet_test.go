package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outboxcdc/cdc/internal/testenv"
)

// TestFleetOfPipelines: two connectors, one per database, one broker. Each
// one's metrics carry its own pipeline label (its name:, not its slot),
// and cdc status over both configs (or their directory) prints a row each.
// The databases share a server here, so their slots need two names.
func TestFleetOfPipelines(t *testing.T) {
	p := testenv.Require(t, pg)
	kafka := testenv.NewKafka(t)
	dir := t.TempDir()
	type member struct {
		name, slot, db, config, base string
		events                       int
	}
	fleet := []*member{{name: "orders", slot: "cdc_a", events: 3}, {name: "billing", slot: "cdc_b", events: 2}}
	for _, m := range fleet {
		m.db = p.NewDatabase(t)
		testenv.Exec(t, m.db, `CREATE TABLE outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregatetype text NOT NULL,
			aggregateid text NOT NULL, type text NOT NULL, payload jsonb)`)
		m.config = filepath.Join(dir, m.name+".yaml")
		os.WriteFile(m.config, []byte(fmt.Sprintf(`
name: %s
postgres: {url: %q, slot: %s, status_interval: 50ms}
kafka: {brokers: [%s]}
tables: [{name: outbox, topic: %q}]
checkpoint: {topic: %s}
http: {listen: "127.0.0.1:0"}
`, m.name, m.db, m.slot, strings.Join(kafka.Brokers, ", "), kafka.Prefix+"outbox.event.{aggregate_type}", kafka.CheckpointTopic())), 0o600)
		m.base = endpointOf(t, startProc(t, m.config))
	}
	for _, m := range fleet {
		testenv.Eventually(t, 30*time.Second, m.name+" to be ready", func() bool {
			code, _ := testenv.Get(t, m.base+"/readyz", "")
			return code == http.StatusOK
		})
		testenv.Exec(t, m.db, fmt.Sprintf(`INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
			SELECT 'order', '%s-' || i, 'E', '{}' FROM generate_series(1, %d) i`, m.name, m.events))
	}
	for _, m := range fleet {
		testenv.Eventually(t, 30*time.Second, fmt.Sprintf("%s to count its %d events", m.name, m.events), func() bool {
			// Labelled by the template: a row chooses the topic (issue 37).
			return value(scrape(t, m.base, ""), "cdc_events_total", "pipeline", m.name, "topic", kafka.Prefix+"outbox.event.{aggregate_type}") == float64(m.events)
		})
		// Every series of this process is this pipeline's, Go's and the
		// process's too.
		for name, f := range scrape(t, m.base, "") {
			for _, s := range f.Metric {
				var got []string
				for _, l := range s.Label {
					if l.GetName() == "pipeline" {
						got = append(got, l.GetValue())
					}
				}
				if len(got) != 1 || got[0] != m.name {
					t.Errorf("%s's %s has pipeline labels %v, want [%s]", m.name, name, got, m.name)
				}
			}
		}
	}

	// cdc status over the directory: a row each, both streaming.
	var out, errOut bytes.Buffer
	if code := run(context.Background(), []string{"status", "--config", dir}, noEnv, &out, &errOut); code != 0 {
		t.Fatalf("cdc status --config %s: exit %d: %s", dir, code, errOut.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "PIPELINE") {
		t.Fatalf("cdc status over two configs:\n%s", out.String())
	}
	for i, m := range []*member{fleet[1], fleet[0]} { // the directory's order
		if f := strings.Fields(lines[i+1]); f[0] != m.name || f[1] != m.slot || f[2] != "yes," {
			t.Errorf("row %d: %q; want %s streaming slot %s", i+1, lines[i+1], m.name, m.slot)
		}
	}
	t.Logf("cdc status --config %s:\n%s", dir, out.String())

	// As JSON, and with a pipeline whose database is down: its row says
	// why, the others are still read, and the exit code is 1.
	down := filepath.Join(t.TempDir(), "down.yaml")
	os.WriteFile(down, []byte(fmt.Sprintf("name: down\npostgres: {url: 'postgres://cdc@127.0.0.1:1/app'}\nkafka: {brokers: [%s]}\n", strings.Join(kafka.Brokers, ", "))), 0o600)
	out.Reset()
	errOut.Reset()
	code := run(context.Background(), []string{"status", "--json", "--config", fleet[0].config, "--config", down}, noEnv, &out, &errOut)
	var rows []pipelineStatus
	if err := json.Unmarshal(out.Bytes(), &rows); err != nil {
		t.Fatalf("cdc status --json over two configs is not a JSON array: %v\n%s", err, out.String())
	}
	if code != 1 || len(rows) != 2 || rows[0].Pipeline != "orders" || rows[0].Status == nil || !rows[0].Status.Slot.Active ||
		rows[1].Pipeline != "down" || rows[1].Status != nil || !strings.Contains(rows[1].Error, "127.0.0.1:1") {
		t.Fatalf("exit %d, rows %s", code, out.String())
	}
}
