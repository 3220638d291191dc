package pipeline_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/opt"
	"github.com/outboxcdc/cdc/internal/pipeline"
	"github.com/outboxcdc/cdc/internal/setup"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// TestCheckKafkaTopics: check looks at the checkpoint topic (it must
// compact) and at every topic that is not a template (it must exist when
// the connector may not create it), and lists each problem; once fixed,
// check passes. A creatable topic passes: the brokers validate its
// creation without creating it.
func TestCheckKafkaTopics(t *testing.T) {
	e := newEnv(t, testenv.NewKafka(t))
	e.cfg.Kafka.CreateTopics, e.cfg.Kafka.AllowAutoTopicCreation = opt.Set(false), opt.Set(false)
	static := e.kafka.Prefix + "orders.static"
	e.cfg.Tables[0].Topic = static
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.kafka.Brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ctx := context.Background()
	if _, err := adm.CreateTopic(ctx, 1, -1, map[string]*string{"cleanup.policy": kadm.StringPtr("delete")}, e.kafka.CheckpointTopic()); err != nil {
		t.Fatal(err)
	}
	// A broker knows of a topic a moment after its controller made it
	// (Apache Kafka; kfake at once): until then check sees none.
	testenv.Eventually(t, 30*time.Second, "the checkpoint topic to be listed with a leader", func() bool {
		topics, err := adm.ListTopics(ctx, e.kafka.CheckpointTopic())
		return err == nil && topics.Has(e.kafka.CheckpointTopic()) && topics[e.kafka.CheckpointTopic()].Err == nil
	})

	check := func() error {
		t.Helper()
		p, err := pipeline.New(e.cfg, hclog.NewNullLogger(), pipeline.Options{})
		if err != nil {
			t.Fatal(err)
		}
		_, err = p.Ops().Check(ctx)
		return err
	}
	err = check()
	var ce *setup.CheckError
	if !errors.As(err, &ce) || len(ce.Problems) != 2 ||
		!strings.Contains(ce.Problems[0], "kafka: topic \""+e.kafka.CheckpointTopic()+"\" has cleanup.policy=delete") ||
		!strings.Contains(ce.Problems[1], "kafka: topic \""+static+"\" does not exist, and the connector may not create it") {
		t.Fatalf("err = %v; want the checkpoint topic's policy and the missing topic", err)
	}
	if _, err := adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Name: "cleanup.policy", Value: kadm.StringPtr("compact")}}, e.kafka.CheckpointTopic()); err != nil {
		t.Fatal(err)
	}
	e.cfg.Kafka.CreateTopics = opt.Set(true)
	if err := check(); err != nil {
		t.Fatalf("a compacted checkpoint topic and a topic the connector may create: %v", err)
	}
	if topics, _ := adm.ListTopics(ctx, static); topics.Has(static) {
		t.Fatalf("check created %s; it must only validate", static)
	}
}

// TestCheckWarnsOfIdleSlotTimeout: on PostgreSQL 18, check warns of an
// idle_replication_slot_timeout that a day-long stop outlasts, or, with a
// replay window, that the window and such a stop outlast; off, or long
// enough, it says nothing. Before 18 there is no such setting, and no
// warning, whatever the window.
func TestCheckWarnsOfIdleSlotTimeout(t *testing.T) {
	testenv.Require(t, pg)
	srv, err := testenv.StartPostgres() // its own: the setting is the server's
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop) // after the database cleanup NewDatabase registers
	db := srv.NewDatabase(t)
	testenv.Exec(t, db, schema)
	kafka := testenv.NewKafka(t)
	cfg := newEnvConfig(db, kafka)
	warning := func(window time.Duration) string {
		t.Helper()
		cfg.Replay.Window = window
		p, err := pipeline.New(cfg, hclog.NewNullLogger(), pipeline.Options{})
		if err != nil {
			t.Fatal(err)
		}
		ws, err := p.Ops().Check(context.Background())
		if err != nil {
			t.Fatalf("check: %v", err)
		}
		var found []string
		for _, w := range ws {
			if strings.Contains(w, "idle_replication_slot_timeout") {
				found = append(found, w)
			}
		}
		if len(found) > 1 {
			t.Fatalf("%d warnings about idle_replication_slot_timeout, want one at most: %q", len(found), found)
		}
		return strings.Join(found, "")
	}
	var version int
	testenv.QueryRow(t, db, `SELECT current_setting('server_version_num')::int`, nil, &version)
	if version < 180000 {
		var n int
		testenv.QueryRow(t, db, `SELECT count(*) FROM pg_settings WHERE name = 'idle_replication_slot_timeout'`, nil, &n)
		if w := warning(time.Hour); n != 0 || w != "" {
			t.Fatalf("PostgreSQL %d: %d settings named idle_replication_slot_timeout, warning %q; want neither", version/10000, n, w)
		}
		return
	}
	set := func(v string) {
		t.Helper()
		testenv.Exec(t, srv.URL, `ALTER SYSTEM SET idle_replication_slot_timeout = '`+v+`'`, `SELECT pg_reload_conf()`)
		testenv.Eventually(t, 30*time.Second, "idle_replication_slot_timeout to be "+v, func() bool {
			var got string
			testenv.QueryRow(t, db, `SHOW idle_replication_slot_timeout`, nil, &got)
			return got == v
		})
	}
	for _, tt := range []struct {
		timeout string
		window  time.Duration
		want    string // "": no warning
	}{
		{"0", time.Hour, ""},
		{"1h", 0, "idle_replication_slot_timeout is 1h, and Postgres invalidates a slot nothing streamed from for that long: the connector's slot is idle while it is stopped, so a stop longer than 1h loses the slot"},
		{"1h", time.Hour, "the replay slot is idle by design for replay.window (1h)"},
		{"1d", 0, ""},
		{"1d", time.Hour, "(or set it to at least '25h'"},
		{"2d", time.Hour, ""},
	} {
		set(tt.timeout)
		w := warning(tt.window)
		if tt.want == "" && w != "" || !strings.Contains(w, tt.want) {
			t.Errorf("timeout %s, replay.window %s: warning %q; want %q", tt.timeout, tt.window, w, tt.want)
		}
	}
}
