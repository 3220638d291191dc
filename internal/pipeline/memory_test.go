package pipeline_test

import (
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"runtime/metrics"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"

	"github.com/outboxcdc/cdc/internal/testenv"
)

// startedHeapBudget is what TestStartedPipelineHeap allows a pipeline's
// start to add to the heap. Measured: 440–475 KB, with in-process kfake,
// with and without -race. 640 KB leaves a third as much again for a
// library's update, and is less than what one table's filter adds (its CEL
// environment and program, 430–480 KB): a structure of that size built at
// start whether or not a table uses it fails at once.
const startedHeapBudget = 640 << 10

// heapChild marks the process TestStartedPipelineHeap measures in.
const heapChild = "CDC_TEST_STARTED_HEAP_CHILD"

// TestStartedPipelineHeap is the connector's fixed cost, as a budget: the
// heap a pipeline's start adds to the process, with no event in flight. A
// peak in a drain is this, the package state of the process
// (docs/benchmarks.md, "Memory (issue 56)") and what the events in flight
// hold, twice over at GOGC=100; a structure built at start for every
// table or every session, used or not, adds to every connector's memory for
// nothing.
//
// It measures the heap live after a collection, not RSS nor a time, so that
// neither the box's load nor the collector's pace moves it: once the
// pipeline streams and one event is acknowledged (the producer has its
// partition's buffers), against the heap just before pipeline.New. It runs
// in a process of its own (this test binary again), where nothing else
// runs and no earlier test built what the pipeline builds once per process
// (an expression environment is one), which a start would otherwise find
// made and not count.
func TestStartedPipelineHeap(t *testing.T) {
	if os.Getenv(heapChild) != "" {
		measureHeap(t)
		return
	}
	held := heapFigure(t, "started-heap")
	t.Logf("a pipeline's start adds %d KB to the heap", held>>10)
	if held > startedHeapBudget {
		t.Errorf("a pipeline's start adds %d KB to the heap, more than the %d KB budget: what does it build? A heap profile (runtime/pprof, inuse_space) after the start against one before shows it; make what a table may not use lazy, or raise the budget with the measurement and why",
			held>>10, startedHeapBudget>>10)
	}
}

// inFlightBudget is what TestInFlightHeapPerEvent allows an event in
// flight to hold, in bytes, with its 200-byte payload and the default
// headers, in one 2000-row transaction. Measured: 789–805, with and
// without -race (the row's copy 288, its record and headers 320, the ack's
// two closures about 120, franz-go's own 40). 896 is a ninth again, and a
// record block with room for 8 headers (972) fails it.
const inFlightBudget = 896

// TestInFlightHeapPerEvent is the other part of a drain's peak: what each
// event waiting for Kafka's ack holds, max_in_flight of them at once. It is
// measured as TestStartedPipelineHeap is, in the same process of its own,
// with produce requests held by the in-process broker until the events
// are all in flight (not with an external broker, which holds none).
func TestInFlightHeapPerEvent(t *testing.T) {
	if os.Getenv(heapChild) != "" {
		t.Skip("measured by TestStartedPipelineHeap's process")
	}
	if testenv.External() {
		t.Skip("the produce requests are held by the in-process broker")
	}
	each := heapFigure(t, "in-flight-heap")
	t.Logf("an event in flight holds %d bytes of heap", each)
	if each > inFlightBudget {
		t.Errorf("an event in flight holds %d bytes of heap, more than the budget of %d: what does a record, its row or its ack keep? A heap profile (inuse_space) with the events in flight against one before shows it",
			each, inFlightBudget)
	}
}

var (
	heapOnce sync.Once
	heapOut  []byte
	heapErr  error
)

// heapFigure is one figure the measuring process printed (name: value).
// The process runs once per test process: this test binary again, with
// the package's Postgres.
func heapFigure(t *testing.T, name string) int64 {
	t.Helper()
	p := testenv.Require(t, pg)
	heapOnce.Do(func() {
		cmd := exec.Command(os.Args[0], "-test.run=^TestStartedPipelineHeap$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), heapChild+"=1", "CDC_TEST_POSTGRES_URL="+p.URL)
		heapOut, heapErr = cmd.CombinedOutput()
	})
	m := regexp.MustCompile(`(?m)^` + name + `: (\d+)$`).FindSubmatch(heapOut)
	if heapErr != nil || m == nil {
		t.Fatalf("the measuring process gave no %s: %v\n%s", name, heapErr, heapOut)
	}
	n, _ := strconv.ParseInt(string(m[1]), 10, 64)
	return n
}

// measureHeap starts a pipeline and prints what it added to the heap, in
// bytes, once it streams and an event is acknowledged; then, with the
// in-process broker, what each event in flight adds.
func measureHeap(t *testing.T) {
	kafka := testenv.NewKafka(t, kfake.MaxVersions(withoutTelemetry()))
	e := newEnv(t, kafka)
	before := liveHeap()
	r := e.start(t)
	acked := r.tracker.Load().Acked()
	testenv.Exec(t, e.db, `INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('order', 'agg-1', 'OrderCreated', '{}')`)
	testenv.Eventually(t, 30*time.Second, "the event acknowledged", func() bool {
		tr := r.tracker.Load()
		return tr.Acked() > acked && tr.InFlight() == 0
	})
	started := liveHeap()
	fmt.Printf("started-heap: %d\n", int64(started)-int64(before))
	if kafka.Fake == nil {
		return
	}
	// The broker holds every produce request until the events are all in
	// flight, then lets them go.
	const n = 2000
	release := make(chan struct{})
	kafka.Fake.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		kafka.Fake.KeepControl()
		kafka.Fake.SleepControl(func() { <-release })
		return nil, nil, false
	})
	defer close(release)
	testenv.Exec(t, e.db, fmt.Sprintf(`INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
		SELECT 'order', 'agg-' || (i %% 1000), 'OrderCreated', jsonb_build_object('i', i, 'pad', repeat('x', 200)) FROM generate_series(1, %d) i`, n))
	testenv.Eventually(t, 30*time.Second, "the events in flight", func() bool { return r.tracker.Load().InFlight() == n })
	fmt.Printf("in-flight-heap: %d\n", (int64(liveHeap())-int64(started))/n)
}

// withoutTelemetry are the requests kfake answers, less client metrics
// (KIP-714). kfake subscribes every client to all of them, which Apache
// Kafka does only with a telemetry reporter configured, and franz-go's
// push then holds a 4 MB lz4 buffer at times: the broker's choice, and
// not in the connector's fixed cost.
func withoutTelemetry() *kversion.Versions {
	v := kversion.Tip()
	v.SetMaxKeyVersion(int16(kmsg.GetTelemetrySubscriptions), -1)
	v.SetMaxKeyVersion(int16(kmsg.PushTelemetry), -1)
	return v
}

// liveHeap is the heap live after a collection, in bytes. Two: a
// sync.Pool's items outlive the first in its victim cache.
func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}
