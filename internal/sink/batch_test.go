package sink

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// produceLog records the records in each produce request the cluster
// receives, and can hold the first one until released, so that a test
// decides when the first record's answer comes back.
type produceLog struct {
	mu       sync.Mutex
	requests []int // how many records each request carried
	gate     chan struct{}
}

func watchProduces(c *kfake.Cluster) *produceLog {
	l := &produceLog{gate: make(chan struct{})}
	c.ControlKey(int16(kmsg.Produce), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		n := 0
		for _, t := range kr.(*kmsg.ProduceRequest).Topics {
			for _, p := range t.Partitions {
				var b kmsg.RecordBatch
				if err := b.ReadFrom(p.Records); err != nil {
					panic(err)
				}
				n += int(b.NumRecords)
			}
		}
		l.mu.Lock()
		l.requests = append(l.requests, n)
		first := len(l.requests) == 1
		l.mu.Unlock()
		if first {
			c.SleepControl(func() { <-l.gate })
		}
		return nil, nil, false // the cluster answers as usual
	})
	return l
}

func (l *produceLog) snapshot() []int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]int(nil), l.requests...)
}

// topicValues reads every record of the test topic back, in log order.
func topicValues(t *testing.T, c *kfake.Cluster, n int) []string {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	var got []string
	for len(got) < n {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("read %d of %d records back: %v", len(got), n, err)
		}
		fs.EachRecord(func(r *kgo.Record) { got = append(got, string(r.Value)) })
	}
	return got
}

// sendAll sends values as records of one key, and returns a channel that
// gets each record's answer in the order the answers come.
func sendAll(k *Kafka, values ...string) <-chan string {
	acked := make(chan string, len(values))
	for _, v := range values {
		v := v
		k.Send(&kgo.Record{Topic: topic, Key: []byte("one-key"), Value: []byte(v)}, func(err error) {
			if err != nil {
				v += " failed: " + err.Error()
			}
			acked <- v
		})
	}
	return acked
}

func expectAcks(t *testing.T, acked <-chan string, want ...string) {
	t.Helper()
	for _, w := range want {
		select {
		case got := <-acked:
			if got != w {
				t.Fatalf("answer %q, want %q (answers must come in the order sent)", got, w)
			}
		case <-time.After(15 * time.Second):
			t.Fatalf("no answer for %q", w)
		}
	}
}

// TestSendBatchesBehindOutstanding: a record sent while nothing is in
// flight goes at once; records sent while it waits for Kafka are held, and
// go together, in order, in one request once its answer comes.
func TestSendBatchesBehindOutstanding(t *testing.T) {
	c := newCluster(t)
	log := watchProduces(c)
	k := newSink(t, c, Config{MaxBatchDelay: time.Second})
	woken := make(chan struct{}, 1)
	k.SetWake(func() {
		select {
		case woken <- struct{}{}:
		default:
		}
	})

	acked := sendAll(k, "e0")
	waitFor(t, "the first record's request", func() bool { return len(log.snapshot()) == 1 })
	more := make([]string, 9)
	for i := range more {
		more[i] = fmt.Sprintf("e%d", i+1)
	}
	acked2 := sendAll(k, more...)
	if n := len(k.batch.held); n != 9 {
		t.Fatalf("%d records held while the first is in flight, want 9", n)
	}
	if due := k.Release(time.Now()); due.IsZero() || time.Until(due) < 500*time.Millisecond {
		t.Fatalf("Release before the first answer let the records go or asked to come back at %v; want about 1s from now", due)
	}

	close(log.gate)
	expectAcks(t, acked, "e0")
	select {
	case <-woken:
	case <-time.After(15 * time.Second):
		t.Fatal("the first record's answer did not wake the sender")
	}
	if due := k.Release(time.Now()); !due.IsZero() {
		t.Fatalf("Release after the answer returned %v; want the zero time, nothing held", due)
	}
	expectAcks(t, acked2, more...)
	if reqs := log.snapshot(); fmt.Sprint(reqs) != "[1 9]" {
		t.Fatalf("records per produce request %v; want [1 9]: the first alone, then the nine held ones together", reqs)
	}
	if got, want := fmt.Sprint(topicValues(t, c, 10)), fmt.Sprint(append([]string{"e0"}, more...)); got != want {
		t.Fatalf("the partition holds %s, want %s", got, want)
	}
}

// TestSendReleasesAfterMaxBatchDelay: held records go once the oldest has
// waited MaxBatchDelay even if the earlier record is still unanswered, so a
// slow or stuck partition delays the others by at most that much; Flush
// lets held records go too.
func TestSendReleasesAfterMaxBatchDelay(t *testing.T) {
	c := newCluster(t)
	log := watchProduces(c)
	k := newSink(t, c, Config{MaxBatchDelay: 20 * time.Millisecond})
	k.SetWake(func() {})

	acked := sendAll(k, "e0")
	waitFor(t, "the first record's request", func() bool { return len(log.snapshot()) == 1 })
	acked1 := sendAll(k, "e1")
	due := k.Release(time.Now())
	if due.IsZero() {
		t.Fatal("Release let e1 go at once while e0 is in flight")
	}
	if next := k.Release(due); !next.IsZero() || len(k.batch.held) != 0 {
		t.Fatalf("Release at the due time kept %d records (next %v); want them sent", len(k.batch.held), next)
	}
	acked2 := sendAll(k, "e2")
	if len(k.batch.held) != 1 {
		t.Fatal("e2 was not held behind e0 and e1")
	}
	close(log.gate)
	if err := k.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	expectAcks(t, acked, "e0")
	expectAcks(t, acked1, "e1")
	expectAcks(t, acked2, "e2")
}

// TestSendWithoutBatching: a negative MaxBatchDelay sends every record at
// once.
func TestSendWithoutBatching(t *testing.T) {
	c := newCluster(t)
	log := watchProduces(c)
	k := newSink(t, c, Config{MaxBatchDelay: -1})
	acked := sendAll(k, "e0")
	waitFor(t, "the first record's request", func() bool { return len(log.snapshot()) == 1 })
	acked1 := sendAll(k, "e1", "e2")
	if len(k.batch.held) != 0 {
		t.Fatal("records were held with batching off")
	}
	close(log.gate)
	expectAcks(t, acked, "e0")
	expectAcks(t, acked1, "e1", "e2")
}
