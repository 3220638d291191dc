package pipeline_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pglogrepl"

	"github.com/outboxcdc/cdc/internal/config"
	"github.com/outboxcdc/cdc/internal/delivery"
	"github.com/outboxcdc/cdc/internal/pipeline"
	"github.com/outboxcdc/cdc/internal/replay"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// BenchmarkReplay catches the main stream up on a backlog of 1-row
// transactions, then replays the same backlog from the replay window with
// cdc replay's code, to the same broker, and compares the two speeds.
//
//	make bench            (CDC_BENCH_EVENTS, default 100000)
func BenchmarkReplay(b *testing.B) {
	events := 100_000
	if v := os.Getenv("CDC_BENCH_EVENTS"); v != "" {
		events, _ = strconv.Atoi(v)
	}
	p := testenv.Require(b, pg)
	for i := 0; i < b.N; i++ {
		db := p.NewDatabase(b)
		testenv.Exec(b, db, schema,
			`CREATE PUBLICATION outbox_cdc FOR TABLE outbox WITH (publish = 'insert')`,
			`SELECT pg_create_logical_replication_slot('outbox_cdc', 'pgoutput')`,
			`SELECT pg_copy_logical_replication_slot('outbox_cdc', 'outbox_cdc_replay')`,
			fillProcedure)
		from := testenv.CurrentWAL(b, db)
		testenv.Exec(b, db, fmt.Sprintf("CALL fill(%d)", events-1))
		beforeLast := testenv.CurrentWAL(b, db)
		testenv.Exec(b, db, "CALL fill(1)")

		kafka := testenv.NewKafka(b)
		cfg := newEnvConfig(db, kafka)
		cfg.Replay.Window = time.Hour
		b.ResetTimer()
		main, _, _ := runUntil(b, cfg, beforeLast)
		pl, err := pipeline.New(cfg, hclog.New(&hclog.LoggerOptions{Level: hclog.Warn}), pipeline.Options{})
		if err != nil {
			b.Fatal(err)
		}
		sum, err := pl.Replay(context.Background(), replay.Request{Range: replay.Range{FromLSN: from}, TopicSuffix: ".replay"}, nil)
		b.StopTimer()
		if err != nil {
			b.Fatal(err)
		}
		if sum.Events != int64(events) {
			b.Fatalf("replayed %d events, want %d", sum.Events, events)
		}
		mainRate, replayRate := float64(events)/main.Seconds(), float64(events)/sum.Elapsed.Seconds()
		b.ReportMetric(mainRate, "catchup_events/s")
		b.ReportMetric(replayRate, "replay_events/s")
		b.ReportMetric(replayRate/mainRate, "ratio")
		fmt.Printf("\nmain stream catch-up: %8.0f events/s\nreplay:               %8.0f events/s\nratio:                %8.2f  (replay / catch-up, same backlog, same run)\n\n", mainRate, replayRate, replayRate/mainRate)
	}
}

func byteSize(n pglogrepl.LSN) string { return fmt.Sprintf("%.1f MB", float64(n)/1e6) }

// fillProcedure writes n outbox rows, one transaction each.
const fillProcedure = `CREATE PROCEDURE fill(n int) LANGUAGE plpgsql AS $$
	BEGIN
	  FOR i IN 1..n LOOP
	    INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
	    VALUES ('order', 'agg-' || (i % 1000), 'OrderCreated', jsonb_build_object('i', i, 'pad', repeat('x', 200)));
	    COMMIT;
	  END LOOP;
	END $$`

// runUntil runs a pipeline until its watermark passes beforeLast and
// returns how long that took and what it allocated.
func runUntil(b *testing.B, cfg config.Config, beforeLast pglogrepl.LSN) (elapsed time.Duration, mallocs, bytes uint64) {
	b.Helper()
	trackers := make(chan *delivery.Tracker, 1)
	p, err := pipeline.New(cfg, hclog.New(&hclog.LoggerOptions{Level: hclog.Warn}), pipeline.Options{OnSession: func(tr *delivery.Tracker) { trackers <- tr }})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)

	runtime.GC()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	start := time.Now()
	go func() { done <- p.Run(ctx) }()
	var tr *delivery.Tracker
	select {
	case tr = <-trackers:
	case err := <-done:
		b.Fatalf("pipeline stopped: %v", err)
	}
	for tr.Confirmed() <= beforeLast {
		select {
		case err := <-done:
			b.Fatalf("pipeline stopped: %v", err)
		case <-tr.Changed():
		case <-time.After(100 * time.Millisecond):
		}
	}
	elapsed = time.Since(start)
	runtime.ReadMemStats(&m1)
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	return elapsed, m1.Mallocs - m0.Mallocs, m1.TotalAlloc - m0.TotalAlloc
}
