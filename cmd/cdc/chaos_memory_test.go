//go:build chaos

package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxcdc/cdc/internal/testenv"
)

// Memory under faults (issue 23, items 4 and 9; docs/design.md, rule 25):
// what the connector holds while Kafka does not answer is bounded in bytes,
// whatever the payloads and whatever else the database does.

// chaosOutage is CDC_CHAOS_OUTAGE (60 s by default; CI 15 s).
func chaosOutage(t *testing.T) time.Duration {
	if v := os.Getenv("CDC_CHAOS_OUTAGE"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("CDC_CHAOS_OUTAGE: %v", err)
		}
		return d
	}
	return time.Minute
}

// peakRSS is a process's peak resident set size (VmHWM), in MB.
func peakRSS(t *testing.T, p *proc) float64 { return testenv.PeakRSS(t, p.cmd.Process.Pid) }

// paced runs fn about rate times a second on its own connection to db
// until ctx ends, counting the calls that succeeded.
func paced(ctx context.Context, db string, rate int, fn func(*pgx.Conn, int) error) (done *atomic.Int64, wait func() error) {
	done = &atomic.Int64{}
	errc := make(chan error, 1)
	go func() {
		conn, err := pgx.Connect(context.Background(), db)
		if err != nil {
			errc <- err
			return
		}
		defer conn.Close(context.Background())
		tick := time.NewTicker(time.Second / time.Duration(rate)) // the load's pace, not a synchronisation
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-ctx.Done():
				errc <- nil
				return
			case <-tick.C:
			}
			if err := fn(conn, i); err != nil {
				errc <- err
				return
			}
			done.Add(1)
		}
	}()
	return done, func() error { return <-errc }
}

// everyEventOnce waits until each outbox row arrived, and fails on a row
// that did not or a record of no row.
func everyEventOnce(t *testing.T, db string, c *testenv.Consumer) (records int) {
	t.Helper()
	d := countDelivered(t, db, c)
	if d.lost+d.unknown > 0 {
		t.Fatalf("%s; want every row, and no record of no row", d)
	}
	return d.records
}

// TestChaosBrokerStallLargePayloads: seed 001's 250 KB payloads at 75 a
// second while the broker is frozen (SIGSTOP) for CDC_CHAOS_OUTAGE. The
// connector stops reading once max_in_flight_bytes (64 MiB) wait for
// Kafka: its peak RSS stays under 128 MB (744 MB for 3,000 rows before the
// byte bound), and every event arrives.
func TestChaosBrokerStallLargePayloads(t *testing.T) {
	outage := chaosOutage(t)
	db := testenv.Require(t, pg).NewDatabase(t)
	testenv.Exec(t, db, `CREATE TABLE outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregatetype text NOT NULL,
		aggregateid text NOT NULL, type text NOT NULL, payload jsonb)`)
	broker := testenv.StartBroker(t)
	kafka := broker.Kafka()
	proc := startProc(t, outboxConfig(t, kafka, fmt.Sprintf("url: %q", db), ""))
	testenv.Eventually(t, 30*time.Second, "the connector to hold the slot", func() bool { return slotActive(t, db) })
	ctx, stop := context.WithCancel(context.Background())
	written, wait := paced(ctx, db, 75, func(conn *pgx.Conn, i int) error {
		_, err := conn.Exec(context.Background(), `INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
			VALUES ('order', $1, 'Large', jsonb_build_object('seq', $2::int, 'blob', repeat(md5($2::text), 7800)))`, fmt.Sprintf("a-%d", i%20), i)
		return err
	})
	c := kafka.NewConsumer(t, kafka.AllTopics())
	c.WaitCount(t, time.Minute, 50)
	broker.Signal(t, syscall.SIGSTOP)
	before := written.Load()
	time.Sleep(outage) // the stall: the fault, not a synchronisation
	during := written.Load() - before
	broker.Signal(t, syscall.SIGCONT)
	stop()
	if err := wait(); err != nil {
		t.Fatal(err)
	}
	records := everyEventOnce(t, db, c)
	rss := peakRSS(t, proc)
	t.Logf("broker stall of %s with 250 KB payloads: %d rows written during it (%.0f MB), %d events, %d records, peak RSS %.1f MB",
		outage, during, float64(during)*0.25, written.Load(), records, rss)
	if rss > 128 {
		t.Errorf("peak RSS %.1f MB during the stall; want at most 128 MB", rss)
	}
}

// TestChaosOutageBusyDatabase: the broker is down for CDC_CHAOS_OUTAGE
// while the outbox gets an event every 100 ms and the database commits
// about 2,000 other transactions a second, each with a logical decoding
// message of another prefix (which pgoutput sends with its BEGIN and
// COMMIT on every version, as 14 does for every transaction). The
// connector's peak RSS stays under 64 MB and every event arrives.
func TestChaosOutageBusyDatabase(t *testing.T) {
	outage := chaosOutage(t)
	db := testenv.Require(t, pg).NewDatabase(t)
	testenv.Exec(t, db, `CREATE TABLE outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregatetype text NOT NULL,
		aggregateid text NOT NULL, type text NOT NULL, payload jsonb)`)
	broker := testenv.StartBroker(t)
	kafka := broker.Kafka()
	proc := startProc(t, outboxConfig(t, kafka, fmt.Sprintf("url: %q", db), ""))
	testenv.Eventually(t, 30*time.Second, "the connector to hold the slot", func() bool { return slotActive(t, db) })
	ctx, stop := context.WithCancel(context.Background())
	_, waitEvents := paced(ctx, db, 10, func(conn *pgx.Conn, i int) error {
		_, err := conn.Exec(context.Background(), `INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('order', $1, 'E', $2)`,
			fmt.Sprintf("a-%d", i%20), fmt.Sprintf(`{"seq": %d}`, i))
		return err
	})
	var noise [2]*atomic.Int64
	var waits [2]func() error
	for i := range noise {
		noise[i], waits[i] = paced(ctx, db, 1000, func(conn *pgx.Conn, _ int) error {
			_, err := conn.Exec(context.Background(), `SELECT pg_logical_emit_message(true, 'not-ours', 'x')`)
			return err
		})
	}
	c := kafka.NewConsumer(t, kafka.AllTopics())
	c.WaitCount(t, time.Minute, 20)
	broker.Stop(t)
	before := noise[0].Load() + noise[1].Load()
	time.Sleep(outage) // the outage: the fault, not a synchronisation
	others := noise[0].Load() + noise[1].Load() - before
	broker.Start(t)
	stop()
	var wg sync.WaitGroup
	for _, w := range append(waits[:], waitEvents) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := w(); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	records := everyEventOnce(t, db, c)
	rss := peakRSS(t, proc)
	t.Logf("broker outage of %s with %d other transactions (%.0f/s): %d records, peak RSS %.1f MB", outage, others, float64(others)/outage.Seconds(), records, rss)
	if rss > 64 {
		t.Errorf("peak RSS %.1f MB during the outage; want at most 64 MB", rss)
	}
}

// TestChaosBigRowBackfill (issue 38, item 1): a first start with 1,500
// pending rows of 250 KB (seed 001's payloads) and backfill: {}, default
// settings: every row arrives, and the connector's peak RSS stays at or
// under 128 MB (549 MB when a chunk was 1,000 rows whatever their size,
// an out-of-memory kill under the Helm chart's 192 Mi limit). A chunk is
// bounded in bytes, and read only once what is in flight leaves room.
func TestChaosBigRowBackfill(t *testing.T) {
	db := testenv.Require(t, pg).NewDatabase(t)
	testenv.Exec(t, db, `CREATE TABLE outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregatetype text NOT NULL,
		aggregateid text NOT NULL, type text NOT NULL, payload jsonb)`,
		`INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
		SELECT 'order', 'a-' || (i % 20), 'Large', jsonb_build_object('seq', i, 'blob', repeat(md5(i::text), 7800)) FROM generate_series(1, 1500) i`)
	broker := testenv.StartBroker(t)
	kafka := broker.Kafka()
	config := filepath.Join(t.TempDir(), "cdc.yaml")
	os.WriteFile(config, []byte(fmt.Sprintf(`
postgres: {url: %q}
kafka: {brokers: [%s]}
tables: [{name: outbox, topic: %q, backfill: {}}]
checkpoint: {topic: %s}
http: {listen: ""}
log: {level: info}
`, db, strings.Join(kafka.Brokers, ", "), kafka.Prefix+"outbox.event.{aggregate_type}", kafka.CheckpointTopic())), 0o600)
	proc := startProc(t, config)
	c := kafka.NewConsumer(t, kafka.AllTopics())
	c.WaitCount(t, 3*time.Minute, 1500)
	records := everyEventOnce(t, db, c)
	rss := peakRSS(t, proc)
	t.Logf("first-start backfill of 1,500 rows of 250 KB: %d records, peak RSS %.1f MB", records, rss)
	if rss > 128 {
		t.Errorf("peak RSS %.1f MB; want at most 128 MB", rss)
	}
}
