//go:build chaos

package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/route"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// The fault scenarios of make chaos (docs/operations.md, "Fault suite").
// Each counts every event: lost, duplicated, reordered within an
// aggregate, and rolled-back rows seen. make chaos runs them on a real
// broker; CDC_CHAOS_KILLS sets the length of the kill loop.

// TestChaosKillLoop: 8 writers commit events for their own aggregates,
// with a per-aggregate sequence, and roll back one transaction in 20,
// while the connector is killed with SIGKILL every 1-2 s and started
// again. Nothing may be lost, reordered or invented; duplicates are
// counted per kill.
func TestChaosKillLoop(t *testing.T) { chaosKillLoop(t, false) }

// TestChaosKillLoopExactlyOnce: the same loop with delivery: exactly-once,
// read by a read_committed consumer: not one duplicate either (issue 11).
func TestChaosKillLoopExactlyOnce(t *testing.T) { chaosKillLoop(t, true) }

func chaosKillLoop(t *testing.T, exactlyOnce bool) {
	kills, rate := 10, 1000
	if v := os.Getenv("CDC_CHAOS_KILLS"); v != "" {
		kills, _ = strconv.Atoi(v)
	}
	if v := os.Getenv("CDC_CHAOS_RATE"); v != "" { // events/s from all writers; 0: as fast as they can
		rate, _ = strconv.Atoi(v)
	}
	p := testenv.Require(t, pg)
	db := p.NewDatabase(t)
	testenv.Exec(t, db, `CREATE TABLE outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregatetype text NOT NULL,
		aggregateid text NOT NULL, type text NOT NULL, payload jsonb)`)
	kafka := testenv.NewKafka(t)
	config := filepath.Join(t.TempDir(), "cdc.yaml")
	if err := os.WriteFile(config, []byte(fmt.Sprintf(`
postgres: {url: %q}
kafka: {brokers: [%s]}
tables: [{name: outbox, topic: %q}]
checkpoint: {topic: %s}
http: {listen: ""}
log: {level: warn}
delivery: %s
`, db, strings.Join(kafka.Brokers, ", "), kafka.Prefix+"outbox.event.{aggregate_type}", kafka.CheckpointTopic(), delivery(exactlyOnce))), 0o600); err != nil {
		t.Fatal(err)
	}
	proc := startProc(t, config)
	testenv.Eventually(t, 30*time.Second, "the connector to hold the slot", func() bool { return slotActive(t, db) })

	// The writers run until the kill loop ends.
	ctx, stopWriters := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := chaosWriter(ctx, db, w, rate/8); err != nil && ctx.Err() == nil {
				errs <- fmt.Errorf("writer %d: %w", w, err)
			}
		}()
	}

	for k := 0; k < kills; k++ {
		time.Sleep(time.Second + rand.N(time.Second)) // the kill interval: the fault, not a synchronisation
		if err := proc.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		proc.cmd.Wait()
		proc = startProc(t, config)
	}
	stopWriters()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	// Every committed event, from the table; rolled-back rows are not in
	// it, and their type says what they were.
	want := outboxIDs(t, db)
	c := kafka.NewConsumer(t, kafka.AllTopics())
	if exactlyOnce {
		c = kafka.NewCommittedConsumer(t, kafka.AllTopics())
	}
	c.WaitFor(t, 5*time.Minute, fmt.Sprintf("all %d events", len(want)), func(recs []*kgo.Record) bool {
		seen := map[string]bool{}
		for _, r := range recs {
			seen[testenv.Header(r, route.HeaderID)] = true
		}
		for id := range want {
			if !seen[id] {
				return false
			}
		}
		return true
	})
	c.Settle(2 * time.Second)

	var lost, dups, reordered, invented, rolledBack int
	count := map[string]int{}
	last := map[string]int{} // per aggregate: the highest sequence first-delivered
	for _, r := range c.Records {
		id := testenv.Header(r, route.HeaderID)
		if testenv.Header(r, route.HeaderEventType) == "RolledBack" {
			rolledBack++
			continue
		}
		if !want[id] {
			invented++
			continue
		}
		if count[id]++; count[id] > 1 {
			dups++
			continue
		}
		var seq int
		fmt.Sscanf(string(r.Value), `{"seq": %d}`, &seq)
		if seq != last[string(r.Key)]+1 {
			reordered++
		}
		last[string(r.Key)] = seq
	}
	for id := range want {
		if count[id] == 0 {
			lost++
		}
	}
	t.Logf("kill loop (%s): %d kills, writers at %d events/s, %d events, %d records: %d lost, %d duplicates (%.0f per kill), %d reordered, %d rolled-back rows seen, %d unknown",
		delivery(exactlyOnce), kills, rate, len(want), len(c.Records), lost, dups, float64(dups)/float64(max(kills, 1)), reordered, rolledBack, invented)
	if lost+reordered+rolledBack+invented > 0 {
		t.Fatalf("%d lost, %d reordered, %d rolled-back rows seen, %d unknown; want 0 each", lost, reordered, rolledBack, invented)
	}
	if exactlyOnce && dups > 0 {
		t.Fatalf("%d duplicates in exactly-once mode; want 0", dups)
	}
}

func delivery(exactlyOnce bool) string {
	if exactlyOnce {
		return "exactly-once"
	}
	return "at-least-once"
}

// chaosWriter commits 1-3 row transactions (2 rows on average) for
// aggregates w*10..w*10+9 with a sequence per aggregate, about rate events
// a second (0: no pause), and rolls back one in 20 (its rows typed
// RolledBack, which must never arrive), until ctx ends.
func chaosWriter(ctx context.Context, db string, w, rate int) error {
	conn, err := pgx.Connect(context.Background(), db)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	var pace <-chan time.Time
	if rate > 0 {
		tick := time.NewTicker(2 * time.Second / time.Duration(rate))
		defer tick.Stop()
		pace = tick.C
	}
	seq := map[int]int{}
	for i := 0; ctx.Err() == nil; i++ {
		if pace != nil {
			select {
			case <-pace: // the writer's pace, not a synchronisation
			case <-ctx.Done():
				return nil
			}
		}
		tx, err := conn.Begin(context.Background())
		if err != nil {
			return err
		}
		rollback := i%20 == 19
		for j := 0; j < 1+i%3; j++ {
			agg := w*10 + (i+j)%10
			typ, s := "E", seq[agg]+1
			if rollback {
				typ = "RolledBack"
			} else {
				seq[agg] = s
			}
			if _, err := tx.Exec(context.Background(), `INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('order', $1, $2, $3)`,
				fmt.Sprintf("a-%02d", agg), typ, fmt.Sprintf(`{"seq": %d}`, s)); err != nil {
				return err
			}
		}
		if rollback {
			err = tx.Rollback(context.Background())
		} else {
			err = tx.Commit(context.Background())
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// TestChaosBrokerOutageExactlyOnce: the broker stops for CDC_CHAOS_OUTAGE
// (60s by default; make chaos) while writers commit, and starts again on
// its data. The connector in exactly-once mode keeps answering Postgres,
// then commits or redoes its open transaction: a read_committed consumer
// sees every event once, in order.
func TestChaosBrokerOutageExactlyOnce(t *testing.T) {
	outage := time.Minute
	if v := os.Getenv("CDC_CHAOS_OUTAGE"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("CDC_CHAOS_OUTAGE: %v", err)
		}
		outage = d
	}
	p := testenv.Require(t, pg)
	db := p.NewDatabase(t)
	testenv.Exec(t, db, `CREATE TABLE outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregatetype text NOT NULL,
		aggregateid text NOT NULL, type text NOT NULL, payload jsonb)`)
	broker := testenv.StartBroker(t)
	kafka := broker.Kafka()
	config := filepath.Join(t.TempDir(), "cdc.yaml")
	if err := os.WriteFile(config, []byte(fmt.Sprintf(`
postgres: {url: %q}
kafka: {brokers: [%s]}
tables: [{name: outbox, topic: %q}]
checkpoint: {topic: %s}
http: {listen: ""}
log: {level: info}
delivery: exactly-once
`, db, strings.Join(kafka.Brokers, ", "), kafka.Prefix+"outbox.event.{aggregate_type}", kafka.CheckpointTopic())), 0o600); err != nil {
		t.Fatal(err)
	}
	proc := startProc(t, config)
	testenv.Eventually(t, 30*time.Second, "the connector to hold the slot", func() bool { return slotActive(t, db) })
	ctx, stopWriters := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := chaosWriter(ctx, db, w, 100); err != nil && ctx.Err() == nil {
				errs <- fmt.Errorf("writer %d: %w", w, err)
			}
		}()
	}
	c := kafka.NewCommittedConsumer(t, kafka.AllTopics())
	c.WaitCount(t, time.Minute, 200)
	broker.Stop(t)
	time.Sleep(outage) // the outage: the fault, not a synchronisation
	broker.Start(t)
	c.WaitCount(t, 5*time.Minute, len(c.Records)+200) // it delivers again
	stopWriters()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if proc.cmd.ProcessState != nil {
		t.Fatalf("the connector exited during the outage:\n%s", proc.out)
	}
	want := outboxIDs(t, db)
	c.WaitFor(t, 5*time.Minute, fmt.Sprintf("all %d events", len(want)), func(recs []*kgo.Record) bool {
		seen := map[string]bool{}
		for _, r := range recs {
			seen[testenv.Header(r, route.HeaderID)] = true
		}
		for id := range want {
			if !seen[id] {
				return false
			}
		}
		return true
	})
	c.Settle(2 * time.Second)
	count := map[string]int{}
	dups, invented := 0, 0
	for _, r := range c.Records {
		id := testenv.Header(r, route.HeaderID)
		if !want[id] {
			invented++
		}
		if count[id]++; count[id] > 1 {
			dups++
		}
	}
	t.Logf("broker outage of %s (exactly-once): %d events, %d records, %d duplicates, %d unknown", outage, len(want), len(c.Records), dups, invented)
	if dups+invented > 0 || len(count) < len(want) {
		t.Fatalf("%d duplicates, %d unknown, %d of %d events; want each once", dups, invented, len(count), len(want))
	}
}
