package sink

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pglogrepl"
	"github.com/outboxcdc/cdc/internal/delivery"
	"github.com/outboxcdc/cdc/internal/opt"
	"github.com/outboxcdc/cdc/internal/testenv"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

const topic = "outbox.event.order"

func newCluster(t *testing.T, opts ...kfake.Opt) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1), kfake.SeedTopics(4, topic)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func newSink(t *testing.T, c *kfake.Cluster, cfg Config) *Kafka {
	t.Helper()
	cfg.Brokers = c.ListenAddrs()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	k, err := New(cfg, hclog.NewNullLogger(),
		kgo.RetryBackoffFn(func(int) time.Duration { return 20 * time.Millisecond }), kgo.MetadataMinAge(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Close)
	return k
}

// partitionOf is the partition franz-go's default partitioner picks for key.
func partitionOf(key string, partitions int) int32 {
	p := kgo.StickyKeyPartitioner(nil).ForTopic(topic)
	return int32(p.Partition(&kgo.Record{Key: []byte(key)}, partitions))
}

// keysFor returns n keys for partition p and n keys for other partitions.
func keysFor(p int32, n int) (on, off []string) {
	for i := 0; len(on) < n || len(off) < n; i++ {
		k := fmt.Sprintf("agg-%d", i)
		if partitionOf(k, 4) == p {
			on = append(on, k)
		} else {
			off = append(off, k)
		}
	}
	return on[:n], off[:n]
}

// produceTxns produces one transaction per key, in order, each ending at
// LSN 10*(i+1).
func produceTxns(k *Kafka, tr *delivery.Tracker, keys []string, endBase int) {
	for i, key := range keys {
		tx := tr.Begin(time.Time{})
		tr.Track(tx, 1)
		k.Produce(&kgo.Record{Topic: topic, Key: []byte(key), Value: []byte("v")}, func(err error) { tr.Ack(tx, 1, err) })
		tr.Commit(tx, pglogrepl.LSN(endBase+10*(i+1)-1), pglogrepl.LSN(endBase+10*(i+1)), time.Time{})
	}
}

func TestPermanentFailureNeverAdvancesWatermark(t *testing.T) {
	c := newCluster(t)
	k := newSink(t, c, Config{})
	on, off := keysFor(2, 5)
	h := c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Partitions: []int32{2}, Err: kerr.InvalidRecord, Count: -1})
	defer h.Remove()

	tr := delivery.NewTracker(0, 100)
	produceTxns(k, tr, off[:2], 0)  // ends 10, 20: succeed
	produceTxns(k, tr, on[:1], 20)  // end 30: fails
	produceTxns(k, tr, off[2:], 30) // ends 40..60: succeed
	if err := k.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := tr.Confirmed(); got != 20 {
		t.Fatalf("Confirmed() = %s, want 0/14: it must stop before the failed transaction", got)
	}
	var pe *ProduceError
	if err := tr.Err(); !errors.As(err, &pe) || !pe.Permanent() || !errors.Is(err, kerr.InvalidRecord) || pe.Partition != 2 {
		t.Fatalf("Err() = %v; want a permanent *ProduceError on partition 2", err)
	}
}

func TestRetriableFaultDeliversAfterItClears(t *testing.T) {
	c := newCluster(t)
	k := newSink(t, c, Config{})
	on, off := keysFor(1, 5)
	h := c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: topic, Partitions: []int32{1}, Err: kerr.NotLeaderForPartition, Count: -1})

	tr := delivery.NewTracker(0, 100)
	produceTxns(k, tr, off[:1], 0) // 10
	produceTxns(k, tr, on[:1], 10) // 20: stuck while the fault lasts
	produceTxns(k, tr, off[1:], 20)
	testenv.Eventually(t, 15*time.Second, "the fault to be hit", func() bool { return h.Hits() >= 3 })
	testenv.Eventually(t, 15*time.Second, "the healthy partitions' acks", func() bool { return tr.InFlight() == 1 })
	if got := tr.Confirmed(); got != 10 {
		t.Fatalf("Confirmed() = %s during the fault, want 0/A", got)
	}
	h.Remove()
	if err := k.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if tr.Err() != nil || tr.Confirmed() != 60 {
		t.Fatalf("after the fault cleared: Confirmed() = %s, Err() = %v; want 0/3C, nil", tr.Confirmed(), tr.Err())
	}
}

func TestMessageTooLarge(t *testing.T) {
	c := newCluster(t)
	k := newSink(t, c, Config{MaxMessageBytes: 1024})
	tr := delivery.NewTracker(0, 10)
	tx := tr.Begin(time.Time{})
	tr.Track(tx, 1)
	k.Produce(&kgo.Record{Topic: topic, Key: []byte("k"), Value: make([]byte, 4096)}, func(err error) { tr.Ack(tx, 1, err) })
	tr.Commit(tx, 9, 10, time.Time{})
	if err := k.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	var pe *ProduceError
	err := tr.Err()
	if !errors.As(err, &pe) || !pe.Permanent() || !strings.Contains(err.Error(), "max.message.bytes") || tr.Confirmed() != 0 {
		t.Fatalf("err = %v, confirmed %s; want a permanent error that names max.message.bytes and no advance", err, tr.Confirmed())
	}
}

// TestEnsureTopic: a missing topic is created with the topic defaults; one
// that neither the connector nor the broker may create is a permanent error
// that says so; a topic merely unknown to the metadata is not permanent.
func TestEnsureTopic(t *testing.T) {
	c := newCluster(t) // auto-creation is off in this cluster
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	k := newSink(t, c, Config{CreateTopics: opt.Set(true), TopicDefaults: TopicDefaults{Partitions: 3}})
	if err := k.EnsureTopic(ctx, "made.here"); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	k.Produce(&kgo.Record{Topic: "made.here", Value: []byte("v")}, func(err error) { done <- err })
	if err := <-done; err != nil {
		t.Fatalf("produce to the created topic: %v", err)
	}
	td, err := kadm.NewClient(k.cl).ListTopics(ctx, "made.here")
	if err != nil || len(td["made.here"].Partitions) != 3 {
		t.Fatalf("created topic: %v, %+v; want 3 partitions", err, td["made.here"])
	}

	none := newSink(t, c, Config{CreateTopics: opt.Set(false), AllowAutoTopicCreation: opt.Set(false)})
	err = none.EnsureTopic(ctx, "no.such.topic")
	var pe *ProduceError
	if !errors.As(err, &pe) || !pe.Permanent() || !strings.Contains(err.Error(), "no.such.topic") ||
		!strings.Contains(err.Error(), "the topic does not exist, and the connector may not create it") {
		t.Fatalf("err = %v; want a permanent error naming the topic and the fix", err)
	}
	if err := none.EnsureTopic(ctx, "made.here"); err != nil {
		t.Fatalf("an existing topic without create rights: %v", err)
	}
	if (&ProduceError{Err: kerr.UnknownTopicOrPartition}).Permanent() {
		t.Fatal("UNKNOWN_TOPIC_OR_PARTITION from a produce is permanent; the topic may be being created")
	}

	// Relying on broker auto-creation where the brokers do not
	// auto-create: refused before the first record, naming the setting.
	relies := newSink(t, c, Config{CreateTopics: opt.Set(false)})
	err = relies.EnsureTopic(ctx, "never.created")
	if !errors.As(err, &pe) || !pe.Permanent() || !strings.Contains(err.Error(), "never.created") ||
		!strings.Contains(err.Error(), "turn on auto.create.topics.enable on the brokers") {
		t.Fatalf("err = %v; want a permanent error naming the topic and auto.create.topics.enable", err)
	}
}

// TestEnsureTopicAutoCreated: relying on brokers that auto-create, the
// topic is created when EnsureTopic asks, before its first record.
func TestEnsureTopicAutoCreated(t *testing.T) {
	c := newCluster(t, kfake.AllowAutoTopicCreation())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	k := newSink(t, c, Config{CreateTopics: opt.Set(false)})
	if err := k.EnsureTopic(ctx, "auto.made"); err != nil {
		t.Fatal(err)
	}
	if c.TopicInfo("auto.made") == nil {
		t.Fatal("EnsureTopic returned, and the broker has not created auto.made")
	}
	done := make(chan error, 1)
	k.Produce(&kgo.Record{Topic: "auto.made", Value: []byte("v")}, func(err error) { done <- err })
	if err := <-done; err != nil {
		t.Fatalf("produce to the auto-created topic: %v", err)
	}
}

// A topic the connector just created can take seconds to get a leader on a
// busy broker. franz-go then asks again every 250ms for 2s, and after that
// no sooner than MetadataMinAge: at its 5s default, a new topic's first
// records sat 5s in the producer in 1 of 4 benchmark runs
// (docs/benchmarks.md). The producer keeps that floor low.
func TestNewTopicMetadataRetriesStayQuick(t *testing.T) {
	cfg := Config{Brokers: []string{"127.0.0.1:1"}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	k, err := New(cfg, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	if got := k.cl.OptValue(kgo.MetadataMinAge).(time.Duration); got > 500*time.Millisecond {
		t.Fatalf("MetadataMinAge %v: a topic still being created would wait that long between metadata requests", got)
	}
}

// TestClientLogIsItsOwnSwitch: franz-go's wire-level lines follow
// log.kafka, not the connector's level: trace logging of the pipeline
// does not turn them on, and log.kafka: debug does at the default level.
func TestClientLogIsItsOwnSwitch(t *testing.T) {
	for _, tc := range []struct {
		client string
		level  hclog.Level
		want   kgo.LogLevel
	}{
		{"", hclog.Trace, kgo.LogLevelError},
		{"debug", hclog.Info, kgo.LogLevelDebug},
		{"warn", hclog.Error, kgo.LogLevelWarn},
	} {
		cfg := Config{Brokers: []string{"127.0.0.1:1"}, ClientLog: tc.client}
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		var buf strings.Builder
		k, err := New(cfg, hclog.New(&hclog.LoggerOptions{Level: tc.level, Output: &buf}))
		if err != nil {
			t.Fatal(err)
		}
		got := k.cl.OptValue(kgo.WithLogger).(kgo.Logger)
		k.Close()
		if got.Level() != tc.want {
			t.Errorf("log.kafka %q with log level %s: franz-go at %v, want %v", tc.client, tc.level, got.Level(), tc.want)
		}
		if tc.client == "debug" {
			got.Log(kgo.LogLevelDebug, "Wrote Produce v13")
			if !strings.Contains(buf.String(), "[INFO]  wrote Produce v13") {
				t.Errorf("log.kafka: debug at log level info: %q; want the line at info", buf.String())
			}
		}
	}
	if err := (&Config{Brokers: []string{"k:1"}, ClientLog: "loud"}).Validate(); err == nil || !strings.Contains(err.Error(), "log.kafka \"loud\"") {
		t.Errorf("log.kafka loud: %v", err)
	}
}

// TestPingNotKafka (issue 39): kafka.brokers pointing at something that
// does not speak Kafka (an HTTP server) is named as such, a permanent
// ConnectError, not "invalid large response size".
func TestPingNotKafka(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusBadRequest) }))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	cfg := Config{Brokers: []string{addr}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	k, err := New(cfg, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = k.Ping(ctx)
	var ce *ConnectError
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), "does not speak the Kafka protocol") || !strings.Contains(err.Error(), addr) {
		t.Fatalf("Ping of an HTTP server: %v; want a ConnectError saying it does not speak Kafka", err)
	}
}
