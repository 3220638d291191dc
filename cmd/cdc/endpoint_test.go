package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/outboxcdc/cdc/internal/ops"
	"github.com/outboxcdc/cdc/internal/testenv"
)

var addrRE = regexp.MustCompile(`addr=http://(127\.0\.0\.1:\d+)`)

// endpointOf waits for the process to log where it serves.
func endpointOf(t *testing.T, p *proc) string {
	t.Helper()
	var addr string
	testenv.Eventually(t, 30*time.Second, "the HTTP endpoint", func() bool {
		m := addrRE.FindStringSubmatch(p.out.String())
		if m != nil {
			addr = m[1]
		}
		return addr != ""
	})
	return "http://" + addr
}

// scrape reads /metrics into families.
func scrape(t *testing.T, base, token string) map[string]*dto.MetricFamily {
	t.Helper()
	code, body := testenv.Get(t, base+"/metrics", token)
	if code != 200 {
		t.Fatalf("/metrics: %d %s", code, body)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

// value is the metric's value with these labels, or -1.
func value(fams map[string]*dto.MetricFamily, name string, labels ...string) float64 {
	f := fams[name]
	if f == nil {
		return -1
	}
next:
	for _, m := range f.Metric {
		for i := 0; i < len(labels); i += 2 {
			found := false
			for _, l := range m.Label {
				found = found || l.GetName() == labels[i] && l.GetValue() == labels[i+1]
			}
			if !found {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue()
		case m.Gauge != nil:
			return m.Gauge.GetValue()
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount())
		}
	}
	return -1
}

// TestMetricsAndProbes runs two connectors on one config: the first holds
// the slot and is ready, the second is a standby that says so. /metrics
// needs the token and counts what was delivered.
func TestMetricsAndProbes(t *testing.T) {
	p := testenv.Require(t, pg)
	db := p.NewDatabase(t)
	testenv.Exec(t, db, `CREATE TABLE outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregatetype text NOT NULL,
		aggregateid text NOT NULL, type text NOT NULL, payload jsonb)`)
	kafka := testenv.NewKafka(t)
	tokenFile := filepath.Join(t.TempDir(), "token")
	os.WriteFile(tokenFile, []byte("metrics-secret\n"), 0o600)
	topic := kafka.Prefix + "outbox.event.{aggregate_type}" // a template labels its events (issue 37)
	config := filepath.Join(t.TempDir(), "cdc.yaml")
	os.WriteFile(config, []byte(fmt.Sprintf(`
postgres: {url: %q, status_interval: 50ms}
kafka: {brokers: [%s]}
tables: [{name: outbox, topic: %q}]
checkpoint: {topic: %s}
http: {listen: "127.0.0.1:0", token_file: %s}
replay: {window: 1h}
`, db, strings.Join(kafka.Brokers, ", "), kafka.Prefix+"outbox.event.{aggregate_type}", kafka.CheckpointTopic(), tokenFile)), 0o600)

	active := startProc(t, config)
	base := endpointOf(t, active)
	testenv.Eventually(t, 30*time.Second, "the active instance to be ready", func() bool {
		code, _ := testenv.Get(t, base+"/readyz", "")
		return code == 200
	})
	if code, body := testenv.Get(t, base+"/metrics", ""); code != http.StatusUnauthorized || strings.Contains(body, "cdc_") {
		t.Fatalf("/metrics without the token: %d %q", code, body)
	}
	if code, _ := testenv.Get(t, base+"/metrics", "wrong"); code != http.StatusUnauthorized {
		t.Fatalf("/metrics with a wrong token: %d", code)
	}
	if code, body := testenv.Get(t, base+"/healthz", ""); code != 200 || !strings.Contains(body, "ok") {
		t.Fatalf("/healthz: %d %q", code, body)
	}
	testenv.Exec(t, db, `INSERT INTO outbox (aggregatetype, aggregateid, type, payload) SELECT 'order', 'k-' || i, 'E', '{}' FROM generate_series(1, 5) i`)
	var fams map[string]*dto.MetricFamily
	testenv.Eventually(t, 30*time.Second, "cdc_events_total to count the 5 events", func() bool {
		fams = scrape(t, base, "metrics-secret")
		return value(fams, "cdc_events_total", "source", "public.outbox", "topic", topic) == 5
	})
	testenv.Eventually(t, 30*time.Second, "the slot metrics", func() bool {
		fams = scrape(t, base, "metrics-secret")
		return value(fams, "cdc_slot_wal_status", "status", "reserved") == 1 && value(fams, "cdc_confirmed_lsn") > 0
	})
	for name, ok := range map[string]func(float64) bool{
		"cdc_streaming":             func(v float64) bool { return v == 1 },
		"cdc_commit_to_ack_seconds": func(v float64) bool { return v == 5 },
		"cdc_in_flight_records":     func(v float64) bool { return v == 0 },
		"cdc_lag_bytes":             func(v float64) bool { return v >= 0 },
		// The WAL from the slot's restart_lsn to the server's position: 0
		// when the slot has caught up with an idle server (PostgreSQL 18,
		// once in CI); -1 is the metric missing.
		"cdc_retained_wal_bytes":         func(v float64) bool { return v >= 0 },
		"cdc_behind_seconds":             func(v float64) bool { return v >= 0 && v < 60 },
		"cdc_checkpoints_total":          func(v float64) bool { return v >= 1 },
		"cdc_restarts_total":             func(v float64) bool { return v == 0 },
		"cdc_kafka_produce_errors_total": func(v float64) bool { return v == 0 },
		"cdc_dead_letters_total":         func(v float64) bool { return v == 0 }, // exported at 0 for each source before any (issue 23)
		"go_goroutines":                  func(v float64) bool { return v > 0 },
		"process_resident_memory_bytes":  func(v float64) bool { return v > 0 },
	} {
		if v := value(fams, name); !ok(v) {
			t.Errorf("%s = %v", name, v)
		}
	}

	standby := startProc(t, config)
	sbase := endpointOf(t, standby)
	testenv.Eventually(t, 30*time.Second, "the standby to say it waits for the slot", func() bool {
		code, body := testenv.Get(t, sbase+"/readyz", "")
		return code == http.StatusServiceUnavailable && strings.Contains(body, `standby: waiting for replication slot "outbox_cdc"`)
	})
	if code, _ := testenv.Get(t, sbase+"/healthz", ""); code != 200 {
		t.Fatalf("a standby's /healthz: %d; it is healthy, only not ready", code)
	}
	if v := value(scrape(t, sbase, "metrics-secret"), "cdc_streaming"); v != 0 {
		t.Fatalf("standby cdc_streaming = %v", v)
	}

	// cdc probe, as compose's healthcheck runs it: ready on the active
	// instance, alive but not ready on the standby, and nothing listening.
	for _, tc := range []struct {
		args       []string
		code       int
		out, inErr string
	}{
		{[]string{"probe", "--ready", "--addr", strings.TrimPrefix(base, "http://")}, 0, "/readyz: ready", ""},
		{[]string{"probe", "--addr", strings.TrimPrefix(sbase, "http://")}, 0, "/healthz: ok", ""},
		{[]string{"probe", "--ready", "--addr", strings.TrimPrefix(sbase, "http://")}, 1, "", `cdc: probe /readyz: not ready: standby: waiting for replication slot "outbox_cdc"`},
		{[]string{"probe", "--addr", "127.0.0.1:1"}, 1, "", "cdc: probe /healthz: "},
	} {
		var out, errOut bytes.Buffer
		code := run(context.Background(), tc.args, noEnv, &out, &errOut)
		if code != tc.code || !strings.Contains(out.String(), tc.out) || !strings.Contains(errOut.String(), tc.inErr) || strings.Count(errOut.String(), "\n") > 1 {
			t.Errorf("cdc %s: exit %d, stdout %q, stderr %q; want exit %d", strings.Join(tc.args, " "), code, out.String(), errOut.String(), tc.code)
		}
	}

	// cdc status, as JSON and as a table.
	var out, errOut bytes.Buffer
	if code := run(context.Background(), []string{"status", "--config", config, "--json"}, noEnv, &out, &errOut); code != 0 {
		t.Fatalf("cdc status --json: exit %d: %s", code, errOut.String())
	}
	var st ops.Status
	if err := json.Unmarshal(out.Bytes(), &st); err != nil {
		t.Fatalf("cdc status --json is not JSON: %v\n%s", err, out.String())
	}
	if !st.Slot.Active || st.Slot.ActivePID == 0 || st.Slot.WALStatus != "reserved" || st.Slot.RetainedBytes <= 0 ||
		len(st.Publication.Tables) != 1 || st.Publication.Tables[0] != "public.outbox" ||
		st.Checkpoint == nil || st.Checkpoint.ConfirmedLSN == "" || st.ReplayWindow == nil || !st.ReplayWindow.Slot.Exists {
		t.Fatalf("cdc status --json = %s", out.String())
	}
	out.Reset()
	if code := run(context.Background(), []string{"status", "--config", config}, noEnv, &out, &errOut); code != 0 {
		t.Fatalf("cdc status: exit %d: %s", code, errOut.String())
	}
	for _, want := range []string{"slot", "outbox_cdc", "active", "retained wal", "publication", "public.outbox", "checkpoint", "replay window", "outbox_cdc_replay"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("cdc status lacks %q:\n%s", want, out.String())
		}
	}
	t.Logf("cdc status:\n%s", out.String())
}
