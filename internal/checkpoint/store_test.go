package checkpoint

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pglogrepl"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

func fakeStore(t *testing.T, topic string) (*Store, *kfake.Cluster) {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := OpenStore(ctx, topic, []kgo.Opt{kgo.SeedBrokers(c.ListenAddrs()...)}, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	return s, c
}

// TestStoreSaveLoad: the newest record of each key wins, a tombstone
// deletes, and an empty topic reads as no records.
func TestStoreSaveLoad(t *testing.T) {
	s, c := fakeStore(t, "cp")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if got, err := s.Load(ctx, false); err != nil || len(got) != 0 {
		t.Fatalf("empty topic: %v, %v", got, err)
	}
	at := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	for i, r := range []Record{
		{Slot: "a", SystemID: "1", Confirmed: 100, UpdatedAt: at},
		{Slot: "b", SystemID: "1", Confirmed: 50, UpdatedAt: at},
		{Slot: "a", SystemID: "1", Confirmed: 200, CommitLSN: 150, CommitTime: at, UpdatedAt: at,
			Marks: Marks{{LSN: 10, Time: at}}, Window: Mark{LSN: 10, Time: at}, History: []Jump{{Kind: JumpRewind, From: 1, To: 2, At: at}}},
	} {
		if err := s.Save(ctx, r); err != nil {
			t.Fatalf("save %d: %v", i, err)
		}
	}
	// A second start opens the existing topic.
	if s, err := OpenStore(ctx, "cp", []kgo.Opt{kgo.SeedBrokers(c.ListenAddrs()...)}, hclog.NewNullLogger()); err != nil || s.Topic() != "cp" {
		t.Fatalf("reopen: %v", err)
	}
	got, err := s.Load(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	a := got[Key("a", "1")]
	if len(got) != 2 || a.Confirmed != 200 || a.CommitLSN != 150 || !a.CommitTime.Equal(at) || len(a.Marks) != 1 ||
		a.Window.LSN != 10 || len(a.History) != 1 || a.History[0].To != pglogrepl.LSN(2) {
		t.Fatalf("loaded %+v", got)
	}
	cl, _ := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	defer cl.Close()
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "cp", Key: []byte(Key("b", "1"))}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if got, err = s.Load(ctx, true); err != nil || len(got) != 1 {
		t.Fatalf("after a tombstone for b: %v, %v", got, err)
	}

	// A topic that would delete checkpoints is refused.
	if _, err := kadm.NewClient(cl).CreateTopic(ctx, 1, -1, map[string]*string{"cleanup.policy": kadm.StringPtr("delete")}, "deleting"); err != nil {
		t.Fatal(err)
	}
	_, err = OpenStore(ctx, "deleting", []kgo.Opt{kgo.SeedBrokers(c.ListenAddrs()...)}, hclog.NewNullLogger())
	var te *TopicError
	if !errors.As(err, &te) || !strings.Contains(err.Error(), "cleanup.policy=compact") {
		t.Fatalf("OpenStore on a delete-policy topic: %v; want a TopicError saying to set cleanup.policy=compact", err)
	}
	cfgs, err := kadm.NewClient(cl).DescribeTopicConfigs(ctx, "cp")
	if err != nil {
		t.Fatal(err)
	}
	rc, _ := cfgs.On("cp", nil)
	for _, c := range rc.Configs {
		if c.Key == "cleanup.policy" && (c.Value == nil || *c.Value != "compact") {
			t.Fatalf("cleanup.policy = %v", c.Value)
		}
	}
}

// TestStoreTopicSegments: the checkpoint topic is created with small
// segments that roll hourly, so that compaction, which cleans only rolled
// segments, keeps it small however many checkpoints were superseded.
func TestStoreTopicSegments(t *testing.T) {
	_, c := fakeStore(t, "cp")
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	described, err := kadm.NewClient(cl).DescribeTopicConfigs(ctx, "cp")
	if err != nil {
		t.Fatal(err)
	}
	rc, err := described.On("cp", nil)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"cleanup.policy": "compact", "segment.bytes": "1048576", "segment.ms": "3600000"}
	for _, cfg := range rc.Configs {
		if w, ok := want[cfg.Key]; ok {
			if cfg.Value == nil || *cfg.Value != w {
				t.Errorf("%s = %v, want %s", cfg.Key, cfg.Value, w)
			}
			delete(want, cfg.Key)
		}
	}
	if len(want) > 0 {
		t.Errorf("not set: %v", want)
	}
}

// TestStartOpen: the store opened in the background is the one OpenStore
// would give (its topic created compacted), and one whose context ends
// first says so rather than hand over a store.
func TestStartOpen(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	opts := []kgo.Opt{kgo.SeedBrokers(c.ListenAddrs()...)}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := StartOpen(ctx, "bg", opts, hclog.NewNullLogger()).Wait()
	if err != nil || s.Topic() != "bg" {
		t.Fatalf("StartOpen: %v, %v", s, err)
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	described, err := kadm.NewClient(cl).DescribeTopicConfigs(ctx, "bg")
	if err != nil {
		t.Fatal(err)
	}
	rc, err := described.On("bg", nil)
	if err != nil {
		t.Fatal(err)
	}
	policy := ""
	for _, cf := range rc.Configs {
		if cf.Key == "cleanup.policy" && cf.Value != nil {
			policy = *cf.Value
		}
	}
	if policy != "compact" {
		t.Fatalf("topic opened in the background has cleanup.policy=%q, want compact", policy)
	}

	ended, stop := context.WithCancel(context.Background())
	stop()
	if s, err := StartOpen(ended, "other", opts, hclog.NewNullLogger()).Wait(); err == nil || s != nil {
		t.Fatalf("StartOpen with an ended context gave %v, %v; want an error", s, err)
	}
}
