package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"
	"go.yaml.in/yaml/v3"

	"github.com/outboxcdc/cdc/internal/config"
	"github.com/outboxcdc/cdc/internal/delivery"
	"github.com/outboxcdc/cdc/internal/pipeline"
	"github.com/outboxcdc/cdc/internal/testenv"
	"github.com/outboxcdc/cdc/internal/testenv/testregistry"
)

// expectedRecord is one entry of an example's expected.yaml.
type expectedRecord struct {
	Topic   string            `yaml:"topic"`
	Key     string            `yaml:"key"`
	Value   *string           `yaml:"value"`   // nil: a tombstone (null value), unless Decoded is set
	Headers map[string]string `yaml:"headers"` // "*": any value; "~text": a value that contains text
	// Decoded is a registry-encoded value read back through the registry,
	// as JSON (Avro's JSON encoding).
	Decoded *string `yaml:"decoded"`
}

// TestExamples streams every examples/ layout unchanged with its own
// config and compares each record's topic, key, headers and value bytes
// with expected.yaml, in order per key.
func TestExamples(t *testing.T) {
	p := testenv.Require(t, pg)
	forEachExample(t, func(t *testing.T, dir string) {
		db := p.NewDatabase(t)
		checkExample(t, dir, db, db, "", func() {})
	})
}

// forEachExample runs fn for each examples/ directory, as a subtest.
func forEachExample(t *testing.T, fn func(t *testing.T, dir string)) {
	dirs, err := filepath.Glob("../../examples/*/cdc.yaml")
	if err != nil || len(dirs) < 6 {
		t.Fatalf("found %d examples (%v)", len(dirs), err)
	}
	for _, cfgPath := range dirs {
		dir := filepath.Dir(cfgPath)
		t.Run(filepath.Base(dir), func(t *testing.T) { fn(t, dir) })
	}
}

// checkExample streams example dir: its schema and events written to
// writeDB, the connector reaching connectorDB (the same database, or a hot
// standby of it with primaryURL its primary's; caughtUp waits for the
// standby to replay what was written), and compares what arrives with
// expected.yaml.
func checkExample(t *testing.T, dir, writeDB, connectorDB, primaryURL string, caughtUp func()) {
	cfgPath := filepath.Join(dir, "cdc.yaml")
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	var want []expectedRecord
	if err := yaml.Unmarshal([]byte(read("expected.yaml")), &want); err != nil || len(want) == 0 {
		t.Fatalf("expected.yaml: %v (%d records)", err, len(want))
	}
	testenv.Exec(t, writeDB, read("schema.sql"))
	caughtUp()
	kafka := testenv.NewKafka(t)
	// pipeline.New fills the default topics that get the prefix,
	// and validates the changed tables again below.
	registry := registerSchemas(t, dir, kafka.Prefix)
	registryURL := ""
	if registry != nil {
		registryURL = registry.URL
	}
	loaded, _, err := config.Load(cfgPath, env("CDC_POSTGRES_URL", connectorDB, "CDC_POSTGRES_PRIMARY_URL", primaryURL, "CDC_KAFKA_BROKERS", strings.Join(kafka.Brokers, ","), "CDC_SCHEMA_REGISTRY_URL", registryURL))
	if err != nil {
		t.Fatalf("%s: %v", cfgPath, err)
	}
	valid, err := pipeline.New(loaded, hclog.NewNullLogger(), pipeline.Options{})
	if err != nil {
		t.Fatalf("%s: %v", cfgPath, err)
	}
	cfg := valid.Config()
	// Unique topic names, so that examples can share a real broker.
	for _, tbl := range cfg.Tables {
		tbl.Topic = kafka.Prefix + tbl.Topic
		tbl.DeadLetterTopic = kafka.Prefix + tbl.DeadLetterTopic
	}
	cfg.Checkpoint.Topic = kafka.CheckpointTopic()
	cfg.Postgres.StatusInterval = 50 * time.Millisecond
	trackers := make(chan *delivery.Tracker, 4)
	pl, err := pipeline.New(cfg, hclog.New(&hclog.LoggerOptions{Level: hclog.Warn}),
		pipeline.Options{OnSession: func(tr *delivery.Tracker) { trackers <- tr }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- pl.Run(ctx) }()
	stopped := false
	defer func() {
		cancel()
		if stopped {
			return // its error is the test's
		}
		if err := <-done; err != nil {
			t.Errorf("pipeline: %v", err)
		}
	}()
	var tr *delivery.Tracker
	select {
	case tr = <-trackers:
	case err := <-done:
		stopped = true
		t.Fatalf("pipeline stopped: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("pipeline did not start streaming")
	}

	testenv.Exec(t, writeDB, read("events.sql"))
	end := testenv.CurrentWAL(t, writeDB)
	c := kafka.NewConsumer(t, kafka.AllTopics())
	c.WaitCount(t, time.Minute, len(want))
	// Every transaction acked: anything more would be in Kafka now.
	testenv.Eventually(t, 30*time.Second, "the events' transactions to be acknowledged", func() bool { return tr.Idle() && tr.Confirmed() > 0 })
	testenv.Eventually(t, 30*time.Second, "the slot to pass the events", func() bool { return testenv.SlotPosition(t, connectorDB, "outbox_cdc") >= end })
	c.Settle(t)
	if len(c.Records) != len(want) {
		for _, r := range c.Records {
			t.Logf("got %s key=%s value=%s", r.Topic, r.Key, r.Value)
		}
		t.Fatalf("%d records, want %d", len(c.Records), len(want))
	}

	// Compare in order per topic and key: that is the order Kafka
	// promises (one key, one partition).
	group := func(topic, key string) string { return topic + "\x00" + key }
	got := map[string][]*kgo.Record{}
	for _, r := range c.Records {
		got[group(r.Topic, string(r.Key))] = append(got[group(r.Topic, string(r.Key))], r)
	}
	next := map[string]int{}
	for i, w := range want {
		g := group(kafka.Prefix+w.Topic, w.Key)
		recs := got[g]
		if next[g] >= len(recs) {
			t.Fatalf("expected record %d (topic %s key %s) not delivered", i, w.Topic, w.Key)
		}
		r := recs[next[g]]
		next[g]++
		switch {
		case w.Decoded != nil:
			if _, got := registry.Decode(t, r); !jsonEqual(got, *w.Decoded) {
				t.Errorf("record %d: decoded value\n  %s\nwant\n  %s", i, got, *w.Decoded)
			}
		case w.Value == nil && r.Value != nil:
			t.Errorf("record %d: value %q, want a tombstone", i, r.Value)
		case w.Value != nil && (r.Value == nil || string(r.Value) != *w.Value):
			t.Errorf("record %d: value\n  %q\nwant\n  %q", i, r.Value, *w.Value)
		}
		gotHeaders := map[string]string{}
		for _, h := range r.Headers {
			if _, dup := gotHeaders[h.Key]; dup {
				t.Errorf("record %d: header %s twice", i, h.Key)
			}
			gotHeaders[h.Key] = string(h.Value)
		}
		for k, v := range w.Headers {
			if g, ok := gotHeaders[k]; !ok || (v != "*" && g != v && !(strings.HasPrefix(v, "~") && strings.Contains(g, v[1:]))) {
				t.Errorf("record %d: header %s = %q (present %v), want %q", i, k, g, ok, v)
			}
		}
		for k := range gotHeaders {
			if _, ok := w.Headers[k]; !ok {
				t.Errorf("record %d: unexpected header %s = %q", i, k, gotHeaders[k])
			}
		}
	}
	if filepath.Base(dir) == "logical-messages" {
		if n := pl.IgnoredMessages.Load(); n != 2 {
			t.Errorf("ignored messages = %d, want 2 (one non-transactional, one unknown prefix)", n)
		}
	}
}

// registerSchemas serves a registry with the schemas of an example's
// registry/ directory, each file under the subject its name gives, with the
// test's topic prefix (the topic naming strategy). It returns nil for an
// example without a registry/ directory.
func registerSchemas(t *testing.T, dir, prefix string) *testregistry.Registry {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dir, "registry", "*"))
	if len(files) == 0 {
		return nil
	}
	reg := testregistry.New(t)
	for _, f := range files {
		text, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		typ := map[string]sr.SchemaType{".avsc": sr.TypeAvro, ".json": sr.TypeJSON, ".proto": sr.TypeProtobuf}[filepath.Ext(f)]
		subject := prefix + strings.TrimSuffix(filepath.Base(f), filepath.Ext(f))
		if _, _, err := reg.RegisterSchema(subject, sr.Schema{Schema: string(text), Type: typ}); err != nil {
			t.Fatalf("register %s: %v", f, err)
		}
	}
	return reg
}

func jsonEqual(a, b string) bool {
	var x, y any
	return json.Unmarshal([]byte(a), &x) == nil && json.Unmarshal([]byte(b), &y) == nil && reflect.DeepEqual(x, y)
}
