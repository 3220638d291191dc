package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/outboxcdc/cdc/internal/config"
	"github.com/outboxcdc/cdc/internal/delivery"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/pipeline"
	"github.com/outboxcdc/cdc/internal/postgres"
	"github.com/outboxcdc/cdc/internal/sink"
	"github.com/outboxcdc/cdc/internal/testenv"
)

var pg *testenv.Postgres

func TestMain(m *testing.M) { testenv.Main(m, &pg) }

// TestConsumerKilledMidBatch: connector → broker → this consumer →
// Postgres. The consumer is killed with SIGKILL while it works through a
// backlog, and started again; every event's effect is applied exactly once.
func TestConsumerKilledMidBatch(t *testing.T) {
	const events = 3000
	p := testenv.Require(t, pg)
	src, dst := p.NewDatabase(t), p.NewDatabase(t)
	testenv.Exec(t, src, `CREATE TABLE outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregatetype text NOT NULL,
		aggregateid text NOT NULL, type text NOT NULL, payload jsonb)`)
	k := testenv.NewKafka(t)

	cfg := config.Config{
		Postgres:   postgres.Config{URL: src, StatusInterval: 50 * time.Millisecond},
		Kafka:      sink.Config{Brokers: k.Brokers},
		Tables:     []*outbox.Source{{Name: outbox.TableName{Schema: "public", Name: "outbox"}, Columns: outbox.DefaultColumns, Topic: k.Prefix + outbox.DefaultTopic}},
		Checkpoint: config.CheckpointConfig{Topic: k.CheckpointTopic()},
	}
	streaming := make(chan struct{}, 1)
	conn, err := pipeline.New(cfg, hclog.New(&hclog.LoggerOptions{Level: hclog.Warn}), pipeline.Options{OnSession: func(*delivery.Tracker) {
		select {
		case streaming <- struct{}{}:
		default:
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- conn.Run(ctx) }()
	defer func() { cancel(); <-done }()
	select {
	case <-streaming:
	case err := <-done:
		t.Fatalf("connector: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("the connector did not start streaming")
	}
	// 30 transactions of 100 events over 50 aggregates and two types.
	testenv.Exec(t, src, fmt.Sprintf(`DO $$ BEGIN FOR tx IN 0..%d LOOP
		INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
		SELECT CASE WHEN i %% 2 = 0 THEN 'order' ELSE 'payment' END, 'agg-' || (i %% 50), 'E', jsonb_build_object('i', i)
		FROM generate_series(tx * 100, tx * 100 + 99) i;
		COMMIT; END LOOP; END $$`, events/100-1))

	bin := filepath.Join(t.TempDir(), "consumer")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build the consumer: %v\n%s", err, out)
	}
	start := func() (*exec.Cmd, *strings.Builder) {
		cmd := exec.Command(bin)
		cmd.Env = append(os.Environ(), "KAFKA_BROKERS="+strings.Join(k.Brokers, ","), "DATABASE_URL="+dst,
			"CONSUMER_GROUP=projection-"+strings.TrimSuffix(k.Prefix, "."), "SESSION_TIMEOUT=6s", "TOPICS=^"+regexp.QuoteMeta(k.Prefix)+`outbox\.event\..*`)
		var out strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd, &out
	}
	applied := func() (rows, distinct int) {
		var exists bool
		testenv.QueryRow(t, dst, `SELECT to_regclass('applied') IS NOT NULL`, nil, &exists)
		if exists {
			testenv.QueryRow(t, dst, `SELECT count(*), count(DISTINCT event_id) FROM applied`, nil, &rows, &distinct)
		}
		return rows, distinct
	}

	first, out := start()
	testenv.Eventually(t, 2*time.Minute, "the consumer to be part-way", func() bool { n, _ := applied(); return n >= 200 })
	_ = first.Process.Signal(syscall.SIGKILL)
	_ = first.Wait()
	if n, _ := applied(); n >= events {
		t.Fatalf("the consumer had applied all %d events before the kill; the test did not kill it mid-way", n)
	}
	second, out2 := start()
	defer func() { _ = second.Process.Signal(syscall.SIGTERM); _ = second.Wait() }()
	testenv.Eventually(t, 2*time.Minute, "every event applied", func() bool { _, d := applied(); return d >= events })
	rows, distinct := applied()
	var total int
	testenv.QueryRow(t, dst, `SELECT sum(events) FROM aggregate_events`, nil, &total)
	if rows != events || distinct != events || total != events {
		t.Fatalf("applied rows %d, distinct events %d, projection total %d; want %d each (each event once)\nfirst run:\n%s\nsecond run:\n%s",
			rows, distinct, total, events, out.String(), out2.String())
	}
}
