package sink

import (
	"context"
	"errors"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestFenceStopsTheOlderProducer: a second producer with the same
// transactional id fences the first (a frozen instance that resumes after
// another took over): the first's commit fails with a *FencedError, and
// nothing it produced is visible to a read_committed consumer.
func TestFenceStopsTheOlderProducer(t *testing.T) {
	c := newCluster(t)
	ctx := context.Background()
	old := newSink(t, c, Config{TransactionalID: "outbox-cdc.test.1"})
	if err := old.BeginTxn(); err != nil {
		t.Fatal(err)
	}
	acked := make(chan error, 1)
	old.Produce(&kgo.Record{Topic: topic, Key: []byte("a"), Value: []byte("from the frozen one")}, func(err error) { acked <- err })
	if err := <-acked; err != nil {
		t.Fatal(err)
	}

	now := newSink(t, c, Config{TransactionalID: "outbox-cdc.test.1"})
	if err := now.Fence(ctx, topic, "fence", []byte("x")); err != nil {
		t.Fatalf("fence: %v", err)
	}
	err := old.CommitTxn(ctx)
	var f *FencedError
	if !errors.As(err, &f) {
		t.Fatalf("the older producer's commit: %v, want a *FencedError", err)
	}

	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics(topic),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var values []string
	for len(values) < 1 {
		fs := cl.PollFetches(ctx)
		fs.EachRecord(func(r *kgo.Record) { values = append(values, string(r.Value)) })
	}
	if len(values) != 1 || values[0] != "x" {
		t.Errorf("read_committed consumer read %q, want only the fence record", values)
	}
}
