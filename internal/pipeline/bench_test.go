package pipeline_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pglogrepl"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/pipeline"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// BenchmarkDrain writes a backlog of outbox rows in 1-row transactions and
// times draining it twice: with pg_recvlogical (the physical limit of
// reading a slot: no decoding into events, no Kafka), and with the
// connector until Kafka has acked every event. Both read identical slots
// created at the same LSN on the same publication. pg_recvlogical runs
// before and after the connector, so page-cache warmth favours neither.
//
//	make bench            (CDC_BENCH_EVENTS, default 100000)
func BenchmarkDrain(b *testing.B) {
	events := 100_000
	if v := os.Getenv("CDC_BENCH_EVENTS"); v != "" {
		events, _ = strconv.Atoi(v)
	}
	p := testenv.Require(b, pg)
	recvlogical := filepath.Join(p.Bin, "pg_recvlogical")
	if p.Bin == "" {
		var err error
		if recvlogical, err = exec.LookPath("pg_recvlogical"); err != nil {
			b.Fatal("pg_recvlogical not found: install the PostgreSQL client binaries")
		}
	}
	for i := 0; i < b.N; i++ {
		db := p.NewDatabase(b)
		testenv.Exec(b, db, schema,
			`CREATE PUBLICATION outbox_cdc FOR TABLE outbox WITH (publish = 'insert')`,
			`SELECT pg_create_logical_replication_slot('ref_before', 'pgoutput')`,
			`SELECT pg_create_logical_replication_slot('outbox_cdc', 'pgoutput')`,
			`SELECT pg_create_logical_replication_slot('ref_after', 'pgoutput')`,
			fillProcedure)
		start, startLSN := time.Now(), testenv.CurrentWAL(b, db)
		testenv.Exec(b, db, fmt.Sprintf("CALL fill(%d)", events-1))
		beforeLast := testenv.CurrentWAL(b, db)
		testenv.Exec(b, db, "CALL fill(1)")
		end := testenv.CurrentWAL(b, db)
		b.Logf("wrote %d events in 1-row transactions in %s (%s of WAL)", events, time.Since(start).Round(time.Millisecond), byteSize(end-startLSN))

		b.ResetTimer()
		refBefore := recvlogicalRate(b, recvlogical, db, "ref_before", end, events)
		rate, allocs, bytes := connectorRate(b, db, beforeLast, events)
		refAfter := recvlogicalRate(b, recvlogical, db, "ref_after", end, events)
		b.StopTimer()

		ref := (refBefore + refAfter) / 2
		b.ReportMetric(rate, "events/s")
		b.ReportMetric(ref, "recvlogical_events/s")
		b.ReportMetric(rate/ref, "ratio")
		b.ReportMetric(allocs, "allocs/event")
		b.ReportMetric(bytes, "B/event")
		fmt.Printf("\nconnector:      %8.0f events/s  (%.1f allocs, %.0f B allocated per event)\n", rate, allocs, bytes)
		fmt.Printf("pg_recvlogical: %8.0f events/s  (before %.0f, after %.0f)\n", ref, refBefore, refAfter)
		fmt.Printf("ratio:          %8.2f  (connector / pg_recvlogical, same backlog, same run)\n\n", rate/ref)
	}
}

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
		sum, err := pl.Replay(context.Background(), pipeline.Replay{Range: pipeline.Range{FromLSN: from}, TopicSuffix: ".replay"}, nil)
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

// recvlogicalRate drains slot up to end with pg_recvlogical.
func recvlogicalRate(b *testing.B, bin, db, slot string, end pglogrepl.LSN, events int) float64 {
	b.Helper()
	start := time.Now()
	out, err := exec.Command(bin, "-d", db, "--slot", slot, "--start", "--no-loop",
		"-o", "proto_version=1", "-o", "publication_names=outbox_cdc",
		"-E", end.String(), "-f", "/dev/null").CombinedOutput()
	if err != nil {
		b.Fatalf("pg_recvlogical: %v\n%s", err, out)
	}
	return float64(events) / time.Since(start).Seconds()
}

// connectorRate runs the pipeline on the outbox_cdc slot until Kafka has
// acked the last event, whose transaction starts after beforeLast.
func connectorRate(b *testing.B, db string, beforeLast pglogrepl.LSN, events int) (rate, allocsPerEvent, bytesPerEvent float64) {
	b.Helper()
	cfg := newEnvConfig(db, testenv.NewKafka(b))
	if v := os.Getenv("CDC_BENCH_LINGER"); v != "" {
		var err error
		if cfg.Kafka.Linger, err = time.ParseDuration(v); err != nil {
			b.Fatal(err)
		}
	}
	elapsed, mallocs, bytes := runUntil(b, cfg, beforeLast)
	return float64(events) / elapsed.Seconds(), float64(mallocs) / float64(events), float64(bytes) / float64(events)
}

// runUntil runs a pipeline until its watermark passes beforeLast and
// returns how long that took and what it allocated.
func runUntil(b *testing.B, cfg pipeline.Config, beforeLast pglogrepl.LSN) (elapsed time.Duration, mallocs, bytes uint64) {
	b.Helper()
	trackers := make(chan *checkpoint.Tracker, 1)
	p, err := pipeline.New(cfg, hclog.New(&hclog.LoggerOptions{Level: hclog.Warn}), pipeline.Options{OnSession: func(tr *checkpoint.Tracker) { trackers <- tr }})
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
	var tr *checkpoint.Tracker
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
