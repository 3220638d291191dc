package pipeline_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/config"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/route"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// slowMatch is a backfill condition's function that costs time per row, as
// a selective condition on a large table does: it sleeps 5 s on every
// 20th row (sqlwhere refuses pg_sleep in the condition itself, not in a
// function the operator wrote). A chunk of 20 rows and the count of 40
// then each take longer than slowUnhealthyAfter.
const slowMatch = `
CREATE FUNCTION public.slow_match(id int) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
	IF id % 20 = 0 THEN PERFORM pg_sleep(5); END IF;
	RETURN true;
END $$;`

// slowUnhealthyAfter is http.unhealthy_after for the slow backfills. While
// the server works on a statement, the watch notes progress at each look:
// looks start a second apart (postgres.backendLook) and one that takes
// longer than two seconds (backendLookTimeout) counts for nothing, so
// progress comes at least every three seconds, which is what the code
// promises whatever the load. A second more keeps /healthz from failing
// between two looks.
const slowUnhealthyAfter = 4 * time.Second

// slowLookGap is the longest the watch may go without noting progress
// while the server works: a look's interval and its timeout.
const slowLookGap = 3 * time.Second

// slowBackfillEnv is a first start whose backfill of event_outbox's 40
// rows runs public.slow_match on each, in chunks of 20: in keyset chunks
// of order_by id, each chunk's query runs the condition on its own rows
// (a Cursor, in commit order, runs it on every row at its first chunk).
func slowBackfillEnv(t *testing.T, kafka *testenv.Kafka) *env {
	t.Helper()
	db := testenv.Require(t, pg).NewDatabase(t)
	testenv.Exec(t, db, pollerSchema, slowMatch, `INSERT INTO event_outbox (aggregate_type, aggregate_id, event_type, payload)
		SELECT 'order', 'agg-' || (i % 5), 'old', '{}' FROM generate_series(1, 40) i`)
	e := &env{db: db, kafka: kafka, cfg: newEnvConfig(db, kafka)}
	e.cfg.Tables = []*outbox.Source{pollerTable(kafka.Prefix, &outbox.BackfillOptions{Where: "public.slow_match(id)", OrderBy: []string{"id"}, ChunkSize: 20})}
	e.cfg.UnhealthyAfter = slowUnhealthyAfter
	return e
}

// healthLooks asks the pipeline's /healthz (Pipeline.Healthy, what the
// endpoint answers with) every 20 ms until stop is called, which returns
// every failure seen, each with how long into the looks it came.
func healthLooks(r *running) (stop func() []string) {
	var mu sync.Mutex
	var failures []string
	done, stopped := make(chan struct{}), make(chan struct{})
	start := time.Now()
	go func() {
		defer close(stopped)
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			if err := r.p.Healthy(); err != nil {
				mu.Lock()
				failures = append(failures, fmt.Sprintf("%s: %v", time.Since(start).Round(10*time.Millisecond), err))
				mu.Unlock()
			}
		}
	}()
	return func() []string {
		close(done)
		<-stopped
		mu.Lock()
		defer mu.Unlock()
		return failures
	}
}

// hasIDs reports whether recs hold an event of each id from from to to.
func hasIDs(recs []*kgo.Record, from, to int) bool {
	got := ids(recs)
	for i := from; i <= to; i++ {
		if got[fmt.Sprint(i)] == 0 {
			return false
		}
	}
	return true
}

// produced returns when the first and the last event of ids from to to
// were produced (their records' timestamps).
func produced(recs []*kgo.Record, from, to int) (first, last time.Time) {
	for _, r := range recs {
		var id int
		if _, err := fmt.Sscan(testenv.Header(r, route.HeaderID), &id); err != nil || id < from || id > to {
			continue
		}
		if first.IsZero() || r.Timestamp.Before(first) {
			first = r.Timestamp
		}
		if r.Timestamp.After(last) {
			last = r.Timestamp
		}
	}
	return first, last
}

// TestHealthyThroughSlowChunks (issue 47): /healthz means stuck, never
// slow. A first start's backfill whose count and every chunk query take
// longer than http.unhealthy_after, because the server works on its
// condition, answers 200 at every look from the start to the end, and
// every row arrives.
func TestHealthyThroughSlowChunks(t *testing.T) {
	kafka := testenv.NewFakeKafka(t)
	e := slowBackfillEnv(t, kafka)
	c := kafka.NewConsumer(t, kafka.AllTopics())
	started := time.Now()
	r := e.launch(t, nil)
	stop := healthLooks(r)
	c.WaitFor(t, time.Minute, "the 40 rows backfilled", func(recs []*kgo.Record) bool { return hasIDs(recs, 1, 40) })
	testenv.Eventually(t, 30*time.Second, "the stream to start after the backfill", func() bool { return r.tracker.Load() != nil })
	if failures := stop(); len(failures) > 0 {
		t.Fatalf("/healthz failed %d times during a backfill whose queries the server worked on; first: %s", len(failures), failures[0])
	}
	// Each query outlasted unhealthy_after: the count (10 s of sleep)
	// before the first chunk, and the second chunk after the first.
	_, first := produced(c.Records, 1, 20)
	second, _ := produced(c.Records, 21, 40)
	if first.Sub(started) < 2*slowUnhealthyAfter || second.Sub(first) < slowUnhealthyAfter {
		t.Fatalf("the first chunk came %s after the start and the second %s after it, not each longer than unhealthy_after (%s): the test proves nothing",
			first.Sub(started).Round(time.Millisecond), second.Sub(first).Round(time.Millisecond), slowUnhealthyAfter)
	}
}

// TestUnhealthyWhileTheBackfillWaitsOnALock (issue 47): the same slow
// first-start backfill, with a second table whose backfill a transaction
// holding an ACCESS EXCLUSIVE lock blocks, answers 200 through the slow
// table and 503 once the statement on the second has waited on the lock
// for unhealthy_after; 200 again, and every row arrives, once the lock
// goes.
//
// The lock is taken once the slow table's first chunk arrived: before the
// slot exists its transaction would hold back the slot's creation instead
// (an ACCESS EXCLUSIVE lock gets a transaction id), and the backfill's
// transaction holds the slow table's lock from its first statement.
func TestUnhealthyWhileTheBackfillWaitsOnALock(t *testing.T) {
	kafka := testenv.NewFakeKafka(t)
	e := slowBackfillEnv(t, kafka)
	testenv.Exec(t, e.db, `CREATE TABLE locked_outbox (LIKE event_outbox INCLUDING ALL)`,
		`INSERT INTO locked_outbox (id, aggregate_type, aggregate_id, event_type, payload)
			SELECT i, 'order', 'agg-' || (i % 5), 'old', '{}' FROM generate_series(1001, 1010) i`)
	locked := pollerTable(kafka.Prefix, &outbox.BackfillOptions{})
	locked.Name.Name = "locked_outbox"
	// The slow table reads in the order of its id, which compares with no
	// other table's rows: a first start of two tables stops on that unless
	// told to send them table by table, as this test wants.
	e.cfg.Backfill.OnUnknownOrder = config.OnUnknownOrderSend
	e.cfg.Tables = append(e.cfg.Tables, locked)
	c := kafka.NewConsumer(t, kafka.AllTopics())
	r := e.launch(t, nil)
	stop := healthLooks(r)
	c.WaitFor(t, time.Minute, "the slow table's first chunk", func(recs []*kgo.Record) bool { return hasIDs(recs, 1, 20) })

	ctx := context.Background()
	holder := testenv.Connect(t, e.db)
	lock, err := holder.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lock.Exec(ctx, "LOCK TABLE locked_outbox IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lock.Rollback(ctx) }) // a test that failed before the release below
	if hasIDs(c.Records, 21, 40) {
		t.Fatal("the slow table was done before the lock: the test cannot tell which statement waits")
	}
	var waiting time.Time
	testenv.Eventually(t, 30*time.Second, "the backfill to wait on the lock", func() bool {
		var n int
		testenv.QueryRow(t, e.db, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = 'outbox-cdc-backfill' AND wait_event_type = 'Lock'`, nil, &n)
		waiting = time.Now()
		return n == 1
	})
	if failures := stop(); len(failures) > 0 {
		t.Fatalf("/healthz failed %d times before the backfill waited on the lock, while the server worked on its chunks; first: %s", len(failures), failures[0])
	}
	testenv.Eventually(t, time.Minute, "/healthz to fail while the backfill waits on a lock", func() bool { return r.p.Healthy() != nil })
	if err := r.p.Healthy(); err == nil || !strings.Contains(err.Error(), "not streaming for") {
		t.Fatalf("Healthy() = %v", err)
	}
	// The last progress came at most a look's gap before the wait was
	// seen: /healthz may fail no sooner than unhealthy_after after that.
	if d := time.Since(waiting); d < slowUnhealthyAfter-slowLookGap {
		t.Fatalf("/healthz failed %s after the wait began, before unhealthy_after (%s) less a look's gap (%s)", d.Round(time.Millisecond), slowUnhealthyAfter, slowLookGap)
	}

	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, "/healthz to recover once the lock is gone", func() bool { return r.p.Healthy() == nil })
	c.WaitFor(t, time.Minute, "every row of both tables", func(recs []*kgo.Record) bool { return hasIDs(recs, 1, 40) && hasIDs(recs, 1001, 1010) })
	testenv.Eventually(t, 30*time.Second, "the stream to start", func() bool { return r.tracker.Load() != nil })
}
