package testenv

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestSettleReadsToTheEnd: Settle returns only once the consumer has read
// every record its topics hold, whatever it waited for before (here
// nothing): records in several partitions of two topics, and past transaction markers, which take offsets but are no
// records. A Settle that returned after a window would count fewer; one
// that stopped at the last record, short of the markers, would fail at
// settleTimeout.
func TestSettleReadsToTheEnd(t *testing.T) {
	k := NewFakeKafka(t)
	// Every fetch is answered a second late (the fault: a slow broker), so
	// that a Settle that read for a window of a second or less would see
	// nothing, where one that reads to the end waits for the answers.
	k.Fake.ControlKey(kmsg.Fetch.Int16(), func(kmsg.Request) (kmsg.Response, error, bool) {
		k.Fake.KeepControl()
		k.Fake.SleepControl(func() { time.Sleep(time.Second) })
		return nil, nil, false
	})
	plain := k.NewConsumer(t, k.AllTopics())
	committed := k.NewCommittedConsumer(t, k.AllTopics())

	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers...), kgo.TransactionalID(k.Prefix+"txn"), kgo.DefaultProduceTopic(k.Prefix+"a"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	if _, err := kadm.NewClient(cl).CreateTopics(ctx, 4, 1, nil, k.Prefix+"a", k.Prefix+"b"); err != nil {
		t.Fatal(err)
	}
	produce := func(topic string, n int) {
		for i := range n {
			if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Key: fmt.Appendf(nil, "k%d", i), Value: []byte("v")}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
	}
	txn := func(commit kgo.TransactionEndTry, topic string, n int) {
		if err := cl.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		produce(topic, n)
		if err := cl.EndTransaction(ctx, commit); err != nil {
			t.Fatal(err)
		}
	}
	txn(kgo.TryCommit, k.Prefix+"a", 40)
	txn(kgo.TryAbort, k.Prefix+"a", 10)
	txn(kgo.TryCommit, k.Prefix+"b", 5) // a topic the consumers have read nothing of yet

	plain.Settle(t)
	if n := len(plain.Records); n != 55 {
		t.Errorf("read_uncommitted: %d records after Settle, want 55 (markers left out)", n)
	}
	committed.Settle(t)
	if n := len(committed.Records); n != 45 {
		t.Errorf("read_committed: %d records after Settle, want the 45 committed", n)
	}
	for _, r := range append(plain.Records, committed.Records...) {
		if r.Attrs.IsControl() {
			t.Fatalf("a transaction marker among the records: %+v", r)
		}
	}
}
