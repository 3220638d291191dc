package sink

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestPinnedPartition: a pinned record goes to its partition, partition 0
// included, whatever its key; a record that is not pinned goes where
// franz-go's default partitioner puts its key, as before pinning existed.
func TestPinnedPartition(t *testing.T) {
	c := newCluster(t)
	k := newSink(t, c, Config{})
	type sent struct {
		key  string
		want int32
	}
	var recs []sent
	done := make(chan error, 40)
	for i := 0; i < 20; i++ {
		key := fmt.Sprintf("agg-%d", i)
		pinned := &kgo.Record{Topic: topic, Key: []byte(key), Value: []byte("pinned")}
		Pin(pinned, int32(i%4))
		plain := &kgo.Record{Topic: topic, Key: []byte(key), Value: []byte("plain")}
		if !Pinned(pinned) || Pinned(plain) {
			t.Fatal("Pinned does not tell a pinned record")
		}
		recs = append(recs, sent{key, int32(i % 4)}, sent{key, partitionOf(key, 4)})
		k.Produce(pinned, func(err error) { done <- err })
		k.Produce(plain, func(err error) { done <- err })
	}
	for range 40 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	got := map[string]int32{}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for len(got) < 40 && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) { got[string(r.Value)+"/"+string(r.Key)] = r.Partition })
	}
	for i, s := range recs {
		what := "pinned"
		if i%2 == 1 {
			what = "plain"
		}
		if p, ok := got[what+"/"+s.key]; !ok || p != s.want {
			t.Errorf("%s record of %s: partition %d (read: %v), want %d", what, s.key, p, ok, s.want)
		}
	}
}

// TestPartitionsLooksAgain: the count is read once, kept for a partition
// inside it, and read again for one past it once the count is older than
// partitionsMaxAge, so a partition added while running is found.
func TestPartitionsLooksAgain(t *testing.T) {
	c := newCluster(t)
	k := newSink(t, c, Config{})
	ctx := context.Background()
	if n, err := k.Partitions(ctx, topic, 0); err != nil || n != 4 {
		t.Fatalf("Partitions = %d, %v; want 4", n, err)
	}
	if _, err := kadm.NewClient(k.cl).CreatePartitions(ctx, 2, topic); err != nil {
		t.Fatal(err)
	}
	if n, _ := k.Partitions(ctx, topic, 5); n != 4 {
		t.Fatalf("Partitions right after a look = %d; want the 4 read then", n)
	}
	k.partitions[topic] = partitionCount{n: 4, at: time.Now().Add(-partitionsMaxAge)}
	if n, _ := k.Partitions(ctx, topic, 1); n != 4 {
		t.Fatalf("Partitions for a partition inside the count = %d; want 4 without a look", n)
	}
	if n, err := k.Partitions(ctx, topic, 5); err != nil || n != 6 {
		t.Fatalf("Partitions past an old count = %d, %v; want the 6 the topic has now", n, err)
	}
	// A topic not listed yet is waited for (one just created is listed a
	// moment later), within ctx.
	short, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if _, err := k.Partitions(short, "no-such-topic", 0); err == nil || !strings.Contains(err.Error(), "the brokers list none yet") {
		t.Fatalf("Partitions of a topic that does not exist: %v", err)
	}
}
