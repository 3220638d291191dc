package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Kafka is a broker for one test.
type Kafka struct {
	Brokers []string
	// Fake is the in-process cluster, or nil with external brokers.
	Fake *kfake.Cluster
	// Prefix makes topic names unique to the test, so that tests can share
	// an external broker.
	Prefix string
}

var topicSeq atomic.Int64

// External reports whether CDC_TEST_KAFKA_BROKERS names real brokers.
func External() bool { return os.Getenv("CDC_TEST_KAFKA_BROKERS") != "" }

// NewKafka returns the external brokers of CDC_TEST_KAFKA_BROKERS, the
// shared testcontainers broker, or a new in-process kfake cluster with topic
// auto-creation and 4 partitions a topic (see backend.go).
func NewKafka(t testing.TB, opts ...kfake.Opt) *Kafka {
	t.Helper()
	prefix := fmt.Sprintf("t%d-%d.", time.Now().UnixNano()%1e9, topicSeq.Add(1))
	if b := os.Getenv("CDC_TEST_KAFKA_BROKERS"); b != "" {
		return &Kafka{Brokers: strings.Split(b, ","), Prefix: prefix}
	}
	if Backend() == backendContainers {
		brokers, err := sharedContainerKafka()
		if err != nil {
			t.Fatal(err)
		}
		return &Kafka{Brokers: brokers, Prefix: prefix}
	}
	return NewFakeKafka(t, opts...)
}

// NewFakeKafka always starts kfake, for tests that inject faults.
func NewFakeKafka(t testing.TB, opts ...kfake.Opt) *Kafka {
	t.Helper()
	c, err := kfake.NewCluster(append([]kfake.Opt{
		kfake.NumBrokers(1), kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(4),
	}, opts...)...)
	if err != nil {
		t.Fatalf("start kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return &Kafka{Brokers: c.ListenAddrs(), Fake: c, Prefix: fmt.Sprintf("t%d.", topicSeq.Add(1))}
}

// CheckpointTopic is a checkpoint topic unique to the test, outside
// AllTopics, so that consumers of the test's events do not read it.
func (k *Kafka) CheckpointTopic() string { return "checkpoints-" + strings.TrimSuffix(k.Prefix, ".") }

// AllTopics is a regular expression for every topic of this test.
func (k *Kafka) AllTopics() string { return "^" + regexp.QuoteMeta(k.Prefix) + ".*" }

// Consumer reads topics from their start.
type Consumer struct {
	cl      *kgo.Client
	Records []*kgo.Record
}

// NewConsumer consumes the topics matching the regular expression.
func (k *Kafka) NewConsumer(t testing.TB, topicRegex string, opts ...kgo.Opt) *Consumer {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{
		kgo.SeedBrokers(k.Brokers...),
		kgo.ConsumeRegex(), kgo.ConsumeTopics(topicRegex),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.MetadataMinAge(100 * time.Millisecond), kgo.MetadataMaxAge(time.Second),
		kgo.FetchMaxWait(200 * time.Millisecond),
	}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return &Consumer{cl: cl}
}

// Client is a plain client of the brokers, closed when the test ends.
func (k *Kafka) Client(t testing.TB) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// NewCommittedConsumer is NewConsumer with isolation.level=read_committed,
// as exactly-once consumers read: records of aborted or open transactions
// are not returned.
func (k *Kafka) NewCommittedConsumer(t testing.TB, topicRegex string) *Consumer {
	return k.NewConsumer(t, topicRegex, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
}

// Settle keeps reading for d, so that records beyond those a test waited
// for (duplicates, strays) show up in Records before it counts them.
func (c *Consumer) Settle(d time.Duration) {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		c.Records = append(c.Records, c.cl.PollFetches(ctx).Records()...)
		cancel()
	}
}

// WaitFor polls until done returns true for the records read so far, or
// fails the test at the deadline.
func (c *Consumer) WaitFor(t testing.TB, timeout time.Duration, what string, done func([]*kgo.Record) bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !done(c.Records) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s (%d records read)", timeout, what, len(c.Records))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 250*time.Millisecond)
		fs := c.cl.PollFetches(ctx)
		cancel()
		fs.EachError(func(topic string, p int32, err error) {
			if err != context.DeadlineExceeded && err != context.Canceled {
				t.Logf("fetch %s/%d: %v", topic, p, err)
			}
		})
		c.Records = append(c.Records, fs.Records()...)
	}
}

// WaitCount waits until at least n records have been read.
func (c *Consumer) WaitCount(t testing.TB, timeout time.Duration, n int) {
	t.Helper()
	c.WaitFor(t, timeout, fmt.Sprintf("%d records", n), func(r []*kgo.Record) bool { return len(r) >= n })
}

// Header returns the value of a record header, or "" if absent.
func Header(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// Eventually polls cond until it holds or the timeout passes.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Broker is a real Apache Kafka broker a test started for itself.
type Broker struct {
	Dir     string
	Brokers []string // the PLAINTEXT listener
	Secure  []string // the SASL_SSL listener, when started with one
	// Proxied is the listener advertised at CDC_KAFKA_PROXIED's address,
	// when started with it: where that address's proxy forwards.
	Proxied string
}

// StartBroker starts a fresh real broker with scripts/kafka.sh (Java and
// the cached jars: make test-kafka fetches them) in a new directory, with
// extra environment (CDC_KAFKA_SECURE_PEM, CDC_KAFKA_SCRAM). It is stopped
// and removed when the test ends.
func StartBroker(t testing.TB, env ...string) *Broker {
	t.Helper()
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cmd := exec.Command(filepath.Join(root, "scripts", "kafka.sh"), "start", dir)
	cmd.Env = append(os.Environ(), env...)
	var errOut strings.Builder
	cmd.Stderr = &errOut
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("start a Kafka broker: %v\n%s", err, errOut.String())
	}
	t.Cleanup(func() { exec.Command(filepath.Join(root, "scripts", "kafka.sh"), "stop", dir).Run() })
	b := &Broker{Dir: dir, Brokers: strings.Split(strings.TrimSpace(string(out)), ",")}
	if s, err := os.ReadFile(filepath.Join(dir, "secure_brokers")); err == nil {
		b.Secure = strings.Split(strings.TrimSpace(string(s)), ",")
	}
	if s, err := os.ReadFile(filepath.Join(dir, "proxied_listener")); err == nil {
		b.Proxied = strings.TrimSpace(string(s))
	}
	return b
}

// Stop stops the broker and keeps its data and port, for Start.
func (b *Broker) Stop(t testing.TB) { b.script(t, "stop", "--keep", b.Dir) }

// Start starts the broker stopped by Stop again, on its port with its data.
func (b *Broker) Start(t testing.TB) { b.script(t, "start", b.Dir) }

func (b *Broker) script(t testing.TB, args ...string) {
	t.Helper()
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(filepath.Join(root, "scripts", "kafka.sh"), args...).CombinedOutput(); err != nil {
		t.Fatalf("kafka.sh %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// Signal sends sig to the broker's process (SIGSTOP freezes it).
func (b *Broker) Signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(b.Dir, "pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, sig); err != nil {
		t.Fatal(err)
	}
}

// Kafka is the broker as a Kafka for one test.
func (b *Broker) Kafka() *Kafka {
	return &Kafka{Brokers: b.Brokers, Prefix: fmt.Sprintf("t%d.", topicSeq.Add(1))}
}

// repoRoot finds the connector's root (where scripts/kafka.sh is) above the
// working directory.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		// The connector's root, also from a module of its own below it
		// (scripts/netchaos).
		if _, err := os.Stat(filepath.Join(dir, "scripts", "kafka.sh")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("scripts/kafka.sh not found above the working directory")
		}
		dir = parent
	}
}
