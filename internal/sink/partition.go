package sink

import (
	"context"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// A record whose partition a table's expression chose (expressions.partition)
// carries pinned as its Context: franz-go's partitioners ignore
// Record.Partition, whose zero value is also a partition, so the mark says
// which records mean theirs. The context is never done, so a pinned record
// can never be cancelled (docs/design.md, rule 12).
type pinnedKey struct{}

var pinned = context.WithValue(context.Background(), pinnedKey{}, true)

// Pin makes rec go to partition p of its topic.
func Pin(rec *kgo.Record, p int32) {
	rec.Partition = p
	rec.Context = pinned
}

// Pinned reports whether rec goes to the partition it names (Pin).
func Pinned(rec *kgo.Record) bool { return rec.Context == pinned }

// partitioner is franz-go's default partitioner (the sticky, adaptive one
// that hashes keys with murmur2, as the Java client does) for every record
// but a pinned one, which goes to its partition. A record that names a
// partition the topic does not have fails in the producer, and so stops
// the session: Sender checks the partition first (Kafka.Partitions).
func partitioner() kgo.Partitioner {
	return pinPartitioner{kgo.UniformBytesPartitioner(64<<10, true, true, nil)}
}

type pinPartitioner struct{ kgo.Partitioner }

func (p pinPartitioner) ForTopic(topic string) kgo.TopicPartitioner {
	inner := p.Partitioner.ForTopic(topic)
	backup, _ := inner.(kgo.TopicBackupPartitioner)
	batch, _ := inner.(kgo.TopicPartitionerOnNewBatch)
	return &pinTopicPartitioner{inner: inner, backup: backup, batch: batch}
}

// pinTopicPartitioner has the optional methods of franz-go's default, which
// franz-go looks for: PartitionByBackup instead of Partition, and
// OnNewBatch. A pinned record asks for consistency, so franz-go offers it
// every partition, indexed by number, not only the writable ones.
type pinTopicPartitioner struct {
	inner  kgo.TopicPartitioner
	backup kgo.TopicBackupPartitioner
	batch  kgo.TopicPartitionerOnNewBatch
}

func (p *pinTopicPartitioner) RequiresConsistency(r *kgo.Record) bool {
	return Pinned(r) || p.inner.RequiresConsistency(r)
}

func (p *pinTopicPartitioner) Partition(r *kgo.Record, n int) int {
	if Pinned(r) {
		return int(r.Partition)
	}
	return p.inner.Partition(r, n)
}

func (p *pinTopicPartitioner) PartitionByBackup(r *kgo.Record, n int, it kgo.TopicBackupIter) int {
	if Pinned(r) {
		return int(r.Partition)
	}
	if p.backup == nil {
		return p.inner.Partition(r, n)
	}
	return p.backup.PartitionByBackup(r, n, it)
}

func (p *pinTopicPartitioner) OnNewBatch() {
	if p.batch != nil {
		p.batch.OnNewBatch()
	}
}

// partitionsMaxAge is how long a topic's partition count is trusted for a
// partition past it: partitions can be added to a topic while the
// connector runs, but a row that names one past the end must not make a
// metadata request per event.
const partitionsMaxAge = 5 * time.Second

// KnownPartitions is Partitions without asking the brokers: ok is false
// when Partitions would ask. It never blocks, so the caller can keep
// Partitions off the per-event path.
func (k *Kafka) KnownPartitions(topic string, p int32) (n int32, ok bool) {
	c, ok := k.partitions[topic]
	return c.n, ok && (p < c.n || time.Since(c.at) < partitionsMaxAge)
}

type partitionCount struct {
	n  int32
	at time.Time
}

// Partitions is how many partitions topic has, for a record pinned to
// partition p: read from the brokers at the topic's first pinned record,
// and again when p is past the count read more than partitionsMaxAge ago.
// It runs on the replication loop's goroutine, like EnsureTopic; ctx bounds
// the lookup.
func (k *Kafka) Partitions(ctx context.Context, topic string, p int32) (int32, error) {
	if n, ok := k.KnownPartitions(topic, p); ok {
		return n, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	var missing error // why the brokers did not list the topic, once they answered
	for looked := false; ; looked = true {
		listed, err := kadm.NewClient(k.cl).ListTopics(ctx, topic)
		if err != nil && looked && ctx.Err() != nil {
			// The wait ran out during a look, after the brokers had
			// answered without the topic: that, not the cut look, is
			// what went wrong.
			return 0, fmt.Errorf("look up the partitions of topic %q: the brokers list none yet (%v)", topic, missing)
		}
		if err != nil {
			return 0, fmt.Errorf("look up the partitions of topic %q: %w", topic, err)
		}
		missing = listed[topic].Err
		// A topic just created is in the brokers' metadata a moment after
		// CreateTopics answered (docs/design.md, "New topics"): wait for it.
		if d := listed[topic]; d.Err == nil && len(d.Partitions) > 0 {
			k.partitions[topic] = partitionCount{n: int32(len(d.Partitions)), at: time.Now()}
			return int32(len(d.Partitions)), nil
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("look up the partitions of topic %q: the brokers list none yet (%v)", topic, missing)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// EndOffset is where partition p of topic ends now (its high watermark):
// a record produced after it is at this offset or past it.
func (k *Kafka) EndOffset(ctx context.Context, topic string, p int32) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	ends, err := kadm.NewClient(k.cl).ListEndOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return 0, fmt.Errorf("read where topic %q ends: %w", topic, err)
	}
	o, ok := ends.Lookup(topic, p)
	if !ok {
		return 0, fmt.Errorf("read where topic %q ends: the brokers list no partition %d", topic, p)
	}
	return o.Offset, nil
}
