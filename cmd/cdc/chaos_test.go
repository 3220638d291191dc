//go:build chaos

package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
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
	config := outboxConfig(t, kafka, fmt.Sprintf("url: %q", db), "delivery: "+deliveryMode(exactlyOnce))
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

	// At each kill, with the process gone, what the slot says was
	// confirmed and how far each partition was appended: every event that
	// committed before the confirmed position must be at an offset below.
	type killPoint struct {
		confirmed pglogrepl.LSN
		ends      map[string]map[int32]int64
	}
	var points []killPoint
	adm := kadm.NewClient(kafka.Client(t))
	for k := 0; k < kills; k++ {
		time.Sleep(time.Second + rand.N(time.Second)) // the kill interval: the fault, not a synchronisation
		if err := proc.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		proc.cmd.Wait()
		kp := killPoint{confirmed: testenv.SlotPosition(t, db, "outbox_cdc"), ends: map[string]map[int32]int64{}}
		ends, err := adm.ListEndOffsets(context.Background(), kafka.Prefix+"outbox.event.order")
		if err != nil {
			t.Fatal(err)
		}
		ends.Each(func(o kadm.ListedOffset) {
			if kp.ends[o.Topic] == nil {
				kp.ends[o.Topic] = map[int32]int64{}
			}
			kp.ends[o.Topic][o.Partition] = o.Offset
		})
		points = append(points, kp)
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
	c := kafka.NewConsumer(t, kafka.AllTopics())
	if exactlyOnce {
		c = kafka.NewCommittedConsumer(t, kafka.AllTopics())
	}
	d := countDelivered(t, db, c)
	// The first offset of each event, and its commit LSN.
	type placed struct {
		commit pglogrepl.LSN
		offset int64
		topic  string
		part   int32
	}
	first := map[string]placed{}
	for _, r := range c.Records {
		id := testenv.Header(r, route.HeaderID)
		if _, ok := first[id]; ok {
			continue
		}
		lsn, _ := pglogrepl.ParseLSN(testenv.Header(r, route.HeaderCommitLSN))
		first[id] = placed{lsn, r.Offset, r.Topic, r.Partition}
	}
	overConfirmed := 0
	for _, kp := range points {
		for id, pl := range first {
			if pl.commit < kp.confirmed && pl.offset >= kp.ends[pl.topic][pl.part] {
				overConfirmed++
				if overConfirmed <= 3 {
					t.Errorf("event %s (commit lsn %s) was confirmed (slot at %s at a kill) before Kafka had appended it", id, pl.commit, kp.confirmed)
				}
			}
		}
	}
	t.Logf("kill loop (%s): %d kills, writers at %d events/s, %s (%.0f duplicates per kill), %d confirmed before Kafka had them",
		deliveryMode(exactlyOnce), kills, rate, d, float64(d.dups)/float64(max(kills, 1)), overConfirmed)
	if d.lost+d.reordered+d.rolledBack+d.unknown > 0 {
		t.Fatalf("%d lost, %d reordered, %d rolled-back rows seen, %d unknown; want 0 each", d.lost, d.reordered, d.rolledBack, d.unknown)
	}
	if exactlyOnce && d.dups > 0 {
		t.Fatalf("%d duplicates in exactly-once mode; want 0", d.dups)
	}
}

func deliveryMode(exactlyOnce bool) string {
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
func TestChaosBrokerOutageExactlyOnce(t *testing.T) { brokerFault(t, false, true) }

// TestChaosBrokerStall: the broker freezes (SIGSTOP) for CDC_CHAOS_OUTAGE
// while writers commit, in at-least-once mode, and resumes: connections
// stay open but nothing answers. The connector keeps answering Postgres,
// does not exit, and loses nothing; nothing is reordered.
func TestChaosBrokerStall(t *testing.T) { brokerFault(t, true, false) }

func brokerFault(t *testing.T, stall, exactlyOnce bool) {
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
	config := outboxConfig(t, kafka, fmt.Sprintf("url: %q", db), "delivery: "+deliveryMode(exactlyOnce))
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
	c := kafka.NewConsumer(t, kafka.AllTopics())
	if exactlyOnce {
		c = kafka.NewCommittedConsumer(t, kafka.AllTopics())
	}
	c.WaitCount(t, time.Minute, 200)
	if stall {
		broker.Signal(t, syscall.SIGSTOP)
		time.Sleep(outage) // the stall: the fault, not a synchronisation
		broker.Signal(t, syscall.SIGCONT)
	} else {
		broker.Stop(t)
		time.Sleep(outage) // the outage: the fault, not a synchronisation
		broker.Start(t)
	}
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
	d := countDelivered(t, db, c)
	what := "outage"
	if stall {
		what = "stall"
	}
	t.Logf("broker %s of %s (%s): %s", what, outage, deliveryMode(exactlyOnce), d)
	if d.lost+d.reordered+d.rolledBack+d.unknown > 0 || (exactlyOnce && d.dups > 0) {
		t.Fatalf("%s; want none lost, reordered or unknown (nor duplicated exactly once)", d)
	}
}

// TestChaosHugeTransaction: one transaction of 500,000 rows (about 250
// bytes each). The connector streams it without holding it: its peak RSS
// stays under 100 MB, bounded by max_in_flight rather than by the
// transaction, and Kafka gets every row once.
func TestChaosHugeTransaction(t *testing.T) {
	const rows = 500_000
	p := testenv.Require(t, pg)
	db := p.NewDatabase(t)
	testenv.Exec(t, db, `CREATE TABLE outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregatetype text NOT NULL,
		aggregateid text NOT NULL, type text NOT NULL, payload jsonb)`)
	kafka := testenv.NewKafka(t)
	config := outboxConfig(t, kafka, fmt.Sprintf("url: %q", db), "")
	proc := startProc(t, config)
	testenv.Eventually(t, 30*time.Second, "the connector to stream", func() bool {
		return strings.Contains(proc.out.String(), "streaming from replication slot")
	})
	testenv.Exec(t, db, fmt.Sprintf(`INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
		SELECT 'order', 'agg-' || (i %% 100), 'E', jsonb_build_object('i', i, 'pad', repeat('x', 150)) FROM generate_series(1, %d) i`, rows))
	end := testenv.CurrentWAL(t, db)
	testenv.Eventually(t, 5*time.Minute, "the transaction to be confirmed", func() bool { return testenv.SlotPosition(t, db, "outbox_cdc") >= end })
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", proc.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	var rssKB int
	for _, l := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			fmt.Sscanf(strings.TrimSpace(v), "%d", &rssKB)
		}
	}
	adm := kadm.NewClient(kafka.Client(t))
	ends, err := adm.ListEndOffsets(context.Background(), kafka.Prefix+"outbox.event.order")
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	ends.Each(func(o kadm.ListedOffset) { total += o.Offset })
	t.Logf("a %d-row transaction: %d records in Kafka, connector peak RSS %.1f MB", rows, total, float64(rssKB)/1024)
	if total != rows {
		t.Errorf("%d records in Kafka, want %d", total, rows)
	}
	if rssKB == 0 || rssKB > 100*1024 {
		t.Errorf("peak RSS %d kB; want at most 100 MB", rssKB)
	}
}

// TestChaosNewTopicsUnderLoad: 4 writers at 1,000 events/s spread their
// events over aggregate types that appear as they go, so the connector
// creates a new topic every few events while it streams: 200 topics. Every
// event arrives once, in its own topic, in order within its aggregate.
func TestChaosNewTopicsUnderLoad(t *testing.T) {
	const types, perWriter = 200, 2500
	p := testenv.Require(t, pg)
	db := p.NewDatabase(t)
	testenv.Exec(t, db, `CREATE TABLE outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregatetype text NOT NULL,
		aggregateid text NOT NULL, type text NOT NULL, payload jsonb)`)
	kafka := testenv.NewKafka(t)
	config := outboxConfig(t, kafka, fmt.Sprintf("url: %q", db), "")
	// A domain of 200 aggregate types: past tables[].max_topics' default
	// of 100, which stops the connector at the 101st topic, so it says so.
	raw, err := os.ReadFile(config)
	if err != nil {
		t.Fatal(err)
	}
	topic := fmt.Sprintf("topic: %q}]", kafka.Prefix+"outbox.event.{aggregate_type}")
	if !strings.Contains(string(raw), topic) {
		t.Fatalf("the config has no table line ending %s:\n%s", topic, raw)
	}
	raw = []byte(strings.Replace(string(raw), topic, strings.TrimSuffix(topic, "}]")+", max_topics: 250}]", 1))
	if err := os.WriteFile(config, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	proc := startProc(t, config)
	testenv.Eventually(t, 30*time.Second, "the connector to stream", func() bool {
		return strings.Contains(proc.out.String(), "streaming from replication slot")
	})
	// A starved box: the broker lists a new topic seconds after creating
	// it, which is what ran the producer's unknown-topic tries out
	// (docs/design.md, "New topics").
	stopBurn := burnCPU(t, 3)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := pgx.Connect(context.Background(), db)
			if err != nil {
				errs <- err
				return
			}
			defer conn.Close(context.Background())
			tick := time.NewTicker(4 * time.Millisecond) // 250 events/s a writer: the load, not a synchronisation
			defer tick.Stop()
			for i := 0; i < perWriter; i++ {
				<-tick.C
				// Type i*types/perWriter: a new type (and topic) every
				// 12 or so events; the aggregate is the writer's own.
				typ := fmt.Sprintf("type%03d", i*types/perWriter)
				if _, err := conn.Exec(context.Background(), `INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ($1, $2, 'E', $3)`,
					typ, fmt.Sprintf("w%d", w), fmt.Sprintf(`{"seq": %d}`, i)); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	stopBurn()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	c := kafka.NewConsumer(t, kafka.AllTopics())
	d := countDelivered(t, db, c)
	for _, r := range c.Records {
		if want := kafka.Prefix + "outbox.event." + testenv.Header(r, route.HeaderAggregateType); r.Topic != want {
			t.Fatalf("event in %s, want %s", r.Topic, want)
		}
	}
	t.Logf("new topics under load: %d topics, %s", len(d.topics), d)
	if d.lost+d.dups+d.reordered+d.unknown > 0 || len(d.topics) != types {
		t.Fatalf("%s, %d topics; want none lost, duplicated, reordered or unknown, and %d topics", d, len(d.topics), types)
	}
}

// delivered is what a consumer received, counted against the outbox rows
// committed.
type delivered struct {
	events, records int // rows committed; records received
	lost, dups      int // rows never received; records of a row received before
	// reordered counts first deliveries whose {"seq": n} is not above the
	// last one of their aggregate (topic and key).
	reordered  int
	rolledBack int // records of rows written in a transaction that rolled back (type RolledBack)
	unknown    int // records of no row
	topics     map[string]bool
}

func (d delivered) String() string {
	return fmt.Sprintf("%d events, %d records: %d lost, %d duplicates, %d reordered, %d rolled-back rows seen, %d unknown",
		d.events, d.records, d.lost, d.dups, d.reordered, d.rolledBack, d.unknown)
}

// countDelivered is the chaos tests' one count: it waits until every outbox
// row committed in db arrived in c, lets c settle, and counts each record
// by its id header.
func countDelivered(t *testing.T, db string, c *testenv.Consumer) delivered {
	t.Helper()
	want := outboxIDs(t, db)
	c.WaitFor(t, 5*time.Minute, fmt.Sprintf("all %d events", len(want)), func(recs []*kgo.Record) bool {
		seen := make(map[string]bool, len(recs))
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
	c.Settle(t)
	d := delivered{events: len(want), records: len(c.Records), topics: map[string]bool{}}
	count := map[string]int{}
	last := map[string]int{}
	for _, r := range c.Records {
		d.topics[r.Topic] = true
		id := testenv.Header(r, route.HeaderID)
		switch {
		case testenv.Header(r, route.HeaderEventType) == "RolledBack":
			d.rolledBack++
			continue
		case !want[id]:
			d.unknown++
			continue
		}
		if count[id]++; count[id] > 1 {
			d.dups++
			continue
		}
		var seq int
		fmt.Sscanf(string(r.Value), `{"seq": %d}`, &seq)
		agg := r.Topic + "/" + string(r.Key)
		if prev, ok := last[agg]; ok && seq <= prev {
			d.reordered++
		}
		last[agg] = seq
	}
	for id := range want {
		if count[id] == 0 {
			d.lost++
		}
	}
	return d
}

// burnCPU keeps n processes of its own spinning until the returned stop
// is called (more than once is fine): other processes, so that the
// writers of this one keep their pace.
func burnCPU(t *testing.T, n int) (stop func()) {
	t.Helper()
	var procs []*exec.Cmd
	for i := 0; i < n; i++ {
		cmd := exec.Command("sh", "-c", "while :; do :; done")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		procs = append(procs, cmd)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			for _, p := range procs {
				_ = p.Process.Kill()
				_ = p.Wait()
			}
		})
	}
	t.Cleanup(stop)
	return stop
}
