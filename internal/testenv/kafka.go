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

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
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
	prefix := UniquePrefix()
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
	return &Kafka{Brokers: c.ListenAddrs(), Fake: c, Prefix: UniquePrefix()}
}

// UniquePrefix is a prefix no other test of this run or of an earlier one
// has: a real broker, and a real registry (whose subjects the pipeline's
// tests name after their topics), outlive a run.
func UniquePrefix() string {
	return fmt.Sprintf("t%d-%d.", time.Now().UnixNano()%1e9, topicSeq.Add(1))
}

// CheckpointTopic is a checkpoint topic unique to the test, outside
// AllTopics, so that consumers of the test's events do not read it.
func (k *Kafka) CheckpointTopic() string { return "checkpoints-" + strings.TrimSuffix(k.Prefix, ".") }

// AllTopics is a regular expression for every topic of this test.
func (k *Kafka) AllTopics() string { return "^" + regexp.QuoteMeta(k.Prefix) + ".*" }

// Consumer reads topics from their start.
type Consumer struct {
	cl        *kgo.Client
	topics    *regexp.Regexp
	committed bool
	// next is, per topic and partition, the offset after the last one
	// read, transaction markers included: where the consumer is.
	next map[string]map[int32]int64
	// Records are the records read so far, without transaction markers.
	Records []*kgo.Record
}

// NewConsumer consumes the topics matching the regular expression.
func (k *Kafka) NewConsumer(t testing.TB, topicRegex string, opts ...kgo.Opt) *Consumer {
	t.Helper()
	re, err := regexp.Compile(topicRegex)
	if err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(append([]kgo.Opt{
		kgo.SeedBrokers(k.Brokers...),
		kgo.ConsumeRegex(), kgo.ConsumeTopics(topicRegex),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.MetadataMinAge(100 * time.Millisecond), kgo.MetadataMaxAge(time.Second),
		kgo.FetchMaxWait(200 * time.Millisecond),
		// Transaction markers take offsets too: seeing them is how Settle
		// knows the consumer reached a partition's end. Records leaves
		// them out.
		kgo.KeepControlRecords(),
	}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	c := &Consumer{cl: cl, topics: re, next: map[string]map[int32]int64{}}
	// OptValue gives the level as the client keeps it: 1 is read_committed.
	c.committed = cl.OptValue(kgo.FetchIsolationLevel) == int8(1)
	return c
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
func (k *Kafka) NewCommittedConsumer(t testing.TB, topicRegex string, opts ...kgo.Opt) *Consumer {
	return k.NewConsumer(t, topicRegex, append([]kgo.Opt{kgo.FetchIsolationLevel(kgo.ReadCommitted())}, opts...)...)
}

// poll reads what the brokers give until ctx ends, and notes where the
// consumer is in each partition.
func (c *Consumer) poll(t testing.TB, ctx context.Context) {
	t.Helper()
	fs := c.cl.PollFetches(ctx)
	fs.EachError(func(topic string, p int32, err error) {
		if err != context.DeadlineExceeded && err != context.Canceled {
			t.Logf("fetch %s/%d: %v", topic, p, err)
		}
	})
	fs.EachRecord(func(rec *kgo.Record) {
		if c.next[rec.Topic] == nil {
			c.next[rec.Topic] = map[int32]int64{}
		}
		c.next[rec.Topic][rec.Partition] = rec.Offset + 1
		if !rec.Attrs.IsControl() {
			c.Records = append(c.Records, rec)
		}
	})
}

// settleTimeout bounds how long Settle reads what the topics held when it
// was called: a minute is far past what kfake or a broker needs to serve a
// test's records, so reaching it is a fault to report, not a slow run.
const settleTimeout = time.Minute

// Settle reads every topic the consumer's expression matches up to where
// it ends now (the high watermark; for a read_committed consumer the last
// stable offset), so that records beyond those a test waited for
// (duplicates, strays) are in Records before it counts them: "nothing
// more" then means nothing more in Kafka, however slow the machine, not
// nothing more within a window. A record its producer has not yet had
// acknowledged is not in Kafka: a test that counts duplicates makes sure
// first that the producer owes nothing (stopped, or its acknowledged
// position past the writes).
func (c *Consumer) Settle(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), settleTimeout)
	defer cancel()
	adm := kadm.NewClient(c.cl)
	// Asked of a broker, not of the client's metadata cache, which may be
	// older than the topics a test just made.
	meta, err := kmsg.NewPtrMetadataRequest().RequestWith(ctx, c.cl)
	if err != nil {
		t.Fatalf("settle: list topics: %v", err)
	}
	var topics []string
	for _, m := range meta.Topics {
		if m.Topic != nil && !m.IsInternal && c.topics.MatchString(*m.Topic) {
			topics = append(topics, *m.Topic)
		}
	}
	if len(topics) == 0 {
		return
	}
	list := adm.ListEndOffsets
	if c.committed {
		list = adm.ListCommittedOffsets
	}
	ends, err := list(ctx, topics...)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		t.Fatalf("settle: list the end offsets of %v: %v", topics, err)
	}
	// A partition whose records were all deleted (DeleteRecords) has
	// nothing to read: its start is its end.
	starts, err := adm.ListStartOffsets(ctx, topics...)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		t.Fatalf("settle: list the start offsets of %v: %v", topics, err)
	}
	behind := func() []string {
		var out []string
		ends.Each(func(o kadm.ListedOffset) {
			if s, ok := starts.Lookup(o.Topic, o.Partition); ok && s.Offset >= o.Offset {
				return
			}
			if at := c.next[o.Topic][o.Partition]; at < o.Offset {
				out = append(out, fmt.Sprintf("%s/%d at %d of %d", o.Topic, o.Partition, at, o.Offset))
			}
		})
		return out
	}
	for {
		b := behind()
		if len(b) == 0 {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("settle: not read to the end in %s: %s", settleTimeout, strings.Join(b, ", "))
		}
		pctx, pcancel := context.WithTimeout(ctx, 250*time.Millisecond)
		c.poll(t, pctx)
		pcancel()
	}
}

// SettleConfirmed is Settle once the connector owes Kafka nothing of what
// was written to db so far: once slot has confirmed the WAL as it is now.
// The connector confirms a position only when Kafka has acknowledged every
// record it made of the WAL before it, so a duplicate or stray made of
// those writes is then in Kafka, and Settle reads it. A slot that does not
// get there within timeout fails the test.
func (c *Consumer) SettleConfirmed(t testing.TB, timeout time.Duration, db, slot string) {
	t.Helper()
	end := CurrentWAL(t, db)
	Eventually(t, timeout, fmt.Sprintf("slot %s to confirm %s", slot, end), func() bool { return SlotPosition(t, db, slot) >= end })
	c.Settle(t)
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
		c.poll(t, ctx)
		cancel()
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
