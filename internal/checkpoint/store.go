package checkpoint

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// DefaultTopic is the checkpoint topic's default name.
const DefaultTopic = "outbox-cdc.checkpoints"

// Store keeps Records in a compacted Kafka topic, one key per pipeline.
// Kafka and not a table: the connector needs no write privilege on the
// database, the record lives beside the events, and exactly-once delivery
// writes it in the same Kafka transaction as the events it covers.
//
// The pipeline writes records through its own producer (NewRecord), so that
// a record is ordered with, and in exactly-once mode committed with, the
// events; Store reads them, and writes on behalf of the operator commands.
type Store struct {
	topic string
	opts  []kgo.Opt
	log   hclog.Logger
	// readOnly: Reader made it; a missing topic reads as empty.
	readOnly bool
	// OnForeign, if set, is called for each record Load skips as not a
	// checkpoint (cdc_checkpoint_foreign_records_total).
	OnForeign func()
	// keys sign the records NewRecord makes (the first) and verify those
	// Load reads (any): SignWith.
	keys [][]byte
}

// MACHeader is the header of a checkpoint record that holds its HMAC.
const MACHeader = "outbox-cdc-mac"

// SignWith makes the store sign every record it makes with keys[0] (an
// HMAC-SHA256 of its key and value, in the MACHeader header), and Load
// take only records that verify with one of keys: anyone who may produce
// to the checkpoint topic could otherwise write a record with a position,
// a backfill job or a table's relation of their choosing, which the next
// start would act on (docs/security.md). keys are checkpoint.signing_key_file's
// lines; none: records are neither signed nor checked.
func (s *Store) SignWith(keys [][]byte) { s.keys = keys }

// recordMAC is the HMAC of a checkpoint record with key and value.
func recordMAC(secret []byte, key string, value []byte) []byte {
	h := hmac.New(sha256.New, secret)
	h.Write([]byte("outbox-cdc checkpoint v1"))
	h.Write([]byte{0})
	h.Write([]byte(key))
	h.Write([]byte{0})
	h.Write(value)
	return h.Sum(nil)
}

// signed reports whether r carries a MAC that one of the store's keys
// made; true when the store has no keys.
func (s *Store) signed(r *kgo.Record) bool {
	if len(s.keys) == 0 {
		return true
	}
	for _, h := range r.Headers {
		if h.Key != MACHeader {
			continue
		}
		got, err := hex.DecodeString(string(h.Value))
		if err != nil {
			return false
		}
		for _, k := range s.keys {
			if hmac.Equal(got, recordMAC(k, string(r.Key), r.Value)) {
				return true
			}
		}
	}
	return false
}

// Reader returns a Store that only reads, and does not create the topic:
// for cdc status, which changes nothing.
func Reader(topic string, opts []kgo.Opt, log hclog.Logger) *Store {
	return &Store{topic: topic, opts: opts, log: log, readOnly: true}
}

// OpenStore makes sure the topic exists and is compacted: a record deleted
// by retention would make a stopped pipeline look new, which is exactly
// the silent gap the store is there to refuse. opts say how to reach the
// cluster (sink.ClientOpts).
func OpenStore(ctx context.Context, topic string, opts []kgo.Opt, log hclog.Logger) (*Store, error) {
	s := &Store{topic: topic, opts: opts, log: log}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("create kafka client: %w", err)
	}
	defer cl.Close()
	if err := s.ensureTopic(ctx, kadm.NewClient(cl)); err != nil {
		return nil, err
	}
	return s, nil
}

// Opening is a store being opened in the background (StartOpen).
type Opening struct {
	done  chan struct{}
	store *Store
	err   error
}

// StartOpen starts OpenStore in the background, so that its round trips
// (a client's metadata, CreateTopics, DescribeConfigs) overlap with other
// work: the pipeline's Postgres start, which needs the store only once it
// reads the checkpoint (docs/benchmarks.md, "Start-up"). Opening only
// prepares the topic, which is idempotent: nothing is read or written.
func StartOpen(ctx context.Context, topic string, opts []kgo.Opt, log hclog.Logger) *Opening {
	o := &Opening{done: make(chan struct{})}
	go func() {
		defer close(o.done)
		o.store, o.err = OpenStore(ctx, topic, opts, log)
	}()
	return o
}

// Wait waits for the store, and returns it or why it could not be opened.
func (o *Opening) Wait() (*Store, error) {
	<-o.done
	return o.store, o.err
}

// Drop waits for an opening whose store was not taken to end (its
// context cancelled first, by the caller): its goroutine logs, and must
// not outlive the session, nor the Run, that started it.
func (o *Opening) Drop() { <-o.done }

// Topic returns the checkpoint topic's name.
func (s *Store) Topic() string { return s.topic }

// ClientOpts are the options s reaches the brokers with, for a client of
// its topic of its own (the requests' follower, package request).
func (s *Store) ClientOpts() []kgo.Opt { return s.opts }

func (s *Store) ensureTopic(ctx context.Context, adm *kadm.Client) error {
	// Small segments that roll hourly: compaction cleans only rolled
	// segments, and with the broker's defaults (1 GB, 7 days) every
	// superseded checkpoint stayed, for every start to read.
	resp, err := adm.CreateTopic(ctx, 1, -1, map[string]*string{
		"cleanup.policy": kadm.StringPtr("compact"),
		"segment.bytes":  kadm.StringPtr("1048576"),
		"segment.ms":     kadm.StringPtr("3600000"),
	}, s.topic)
	if err == nil {
		err = resp.Err
	}
	var refused *kerr.Error
	switch {
	case err == nil:
		s.log.Info("created the checkpoint topic", "topic", s.topic, "cleanup_policy", "compact")
		return nil
	case errors.Is(err, kerr.TopicAlreadyExists):
	case errors.As(err, &refused):
		return &TopicError{fmt.Errorf("create checkpoint topic %q: %w; create it yourself with cleanup.policy=compact, or grant the connector CREATE on it (checkpoint.topic names it)", s.topic, err)}
	default:
		return fmt.Errorf("create checkpoint topic %q: %w; check kafka.brokers and that the brokers are up", s.topic, err)
	}
	described, err := adm.DescribeTopicConfigs(ctx, s.topic)
	if err != nil {
		return fmt.Errorf("describe checkpoint topic %q: %w", s.topic, err)
	}
	rc, err := described.On(s.topic, nil)
	if err != nil || rc.Err != nil {
		return fmt.Errorf("describe checkpoint topic %q: %v; grant the connector DESCRIBE_CONFIGS on it", s.topic, errors.Join(err, rc.Err))
	}
	for _, c := range rc.Configs {
		if c.Key == "cleanup.policy" && c.Value != nil && !strings.Contains(*c.Value, "compact") {
			return &TopicError{fmt.Errorf("checkpoint topic %q has cleanup.policy=%s, so Kafka would delete the checkpoint; set cleanup.policy=compact on it (kafka-configs.sh --alter --entity-type topics --entity-name %s --add-config cleanup.policy=compact)", s.topic, *c.Value, s.topic)}
		}
	}
	return nil
}

// TopicError is a checkpoint topic the connector cannot use as it is: an
// operator must create or reconfigure it, so retrying cannot help.
type TopicError struct{ err error }

func (e *TopicError) Error() string { return e.err.Error() }
func (e *TopicError) Unwrap() error { return e.err }

// NewRecord is the Kafka record that stores rec.
func (s *Store) NewRecord(rec Record) (*kgo.Record, error) {
	v, err := json.Marshal(rec)
	if err != nil {
		return nil, fmt.Errorf("encode checkpoint: %w", err)
	}
	r := &kgo.Record{Topic: s.topic, Key: []byte(rec.Key()), Value: v, Timestamp: rec.UpdatedAt}
	if len(s.keys) > 0 {
		r.Headers = []kgo.RecordHeader{{Key: MACHeader, Value: []byte(hex.EncodeToString(recordMAC(s.keys[0], rec.Key(), v)))}}
	}
	return r, nil
}

// Save writes rec and waits for Kafka's acknowledgement. The operator
// commands use it; a running pipeline writes through its producer.
func (s *Store) Save(ctx context.Context, rec Record) error {
	r, err := s.NewRecord(rec)
	if err != nil {
		return err
	}
	if err := s.produce(ctx, r); err != nil {
		return fmt.Errorf("write checkpoint to topic %q: %w", s.topic, err)
	}
	return nil
}

// produce writes r with a client of its own and waits for all in-sync
// replicas.
func (s *Store) produce(ctx context.Context, r *kgo.Record) error {
	cl, err := kgo.NewClient(append(s.opts, kgo.RequiredAcks(kgo.AllISRAcks()))...)
	if err != nil {
		return fmt.Errorf("create kafka client: %w", err)
	}
	defer cl.Close()
	return cl.ProduceSync(ctx, r).FirstErr()
}

// Delete removes key's record (a tombstone): the pipeline starts afresh,
// as if it never ran. The demo uses it; an operator would rather use a new
// checkpoint topic or slot name.
func (s *Store) Delete(ctx context.Context, key string) error {
	r := &kgo.Record{Topic: s.topic, Key: []byte(key)}
	if len(s.keys) > 0 {
		r.Headers = []kgo.RecordHeader{{Key: MACHeader, Value: []byte(hex.EncodeToString(recordMAC(s.keys[0], key, nil)))}}
	}
	if err := s.produce(ctx, r); err != nil {
		return fmt.Errorf("delete checkpoint %q from topic %q: %w", key, s.topic, err)
	}
	return nil
}

// Load reads the topic to its end and returns the newest record of every
// key. readCommitted skips records of aborted or open Kafka transactions,
// as exactly-once delivery needs.
func (s *Store) Load(ctx context.Context, readCommitted bool) (map[string]Record, error) {
	return s.load(ctx, readCommitted, nil)
}

// RequestKey is the key of backfill request id of the pipeline whose
// checkpoint key is key.
func RequestKey(key, id string) string { return key + "/backfill/" + id }

// Put writes value under key and waits for Kafka's acknowledgement, with
// no signature: for the records beside the checkpoints (a backfill
// request, which is signed on its own).
func (s *Store) Put(ctx context.Context, key string, value []byte) error {
	if err := s.produce(ctx, &kgo.Record{Topic: s.topic, Key: []byte(key), Value: value}); err != nil {
		return fmt.Errorf("write %s to topic %q: %w", key, s.topic, err)
	}
	return nil
}

func (s *Store) load(ctx context.Context, readCommitted bool, raw map[string][]byte) (map[string]Record, error) {
	ends, err := s.ends(ctx, readCommitted)
	if err != nil {
		return nil, err
	}
	start := map[int32]kgo.Offset{}
	want := map[int32]int64{} // partition -> offset to read up to
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			start[o.Partition] = kgo.NewOffset().AtStart()
			want[o.Partition] = o.Offset
		}
	})
	out := map[string]Record{}
	if len(want) == 0 {
		return out, nil
	}
	opts := append(s.opts[:len(s.opts):len(s.opts)],
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{s.topic: start}),
		// Control records make the last offset before the end visible
		// even when it is a transaction marker.
		kgo.KeepControlRecords())
	if readCommitted {
		opts = append(opts, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("create kafka client: %w", err)
	}
	defer cl.Close()
	for len(want) > 0 {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return nil, fmt.Errorf("read checkpoint topic %q: %w", s.topic, ctx.Err())
		}
		if err := fs.Err(); err != nil {
			return nil, fmt.Errorf("read checkpoint topic %q: %w", s.topic, err)
		}
		fs.EachRecord(func(r *kgo.Record) {
			if end, ok := want[r.Partition]; ok && r.Offset+1 >= end {
				delete(want, r.Partition)
			}
			s.take(r, out, raw)
		})
	}
	return out, nil
}

// ends lists where the checkpoint topic's partitions end (committed, with
// readCommitted); none for a read-only store's missing topic.
func (s *Store) ends(ctx context.Context, readCommitted bool) (kadm.ListedOffsets, error) {
	cl, err := kgo.NewClient(s.opts...)
	if err != nil {
		return nil, fmt.Errorf("create kafka client: %w", err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	// A topic created a moment ago may not be in every broker's metadata
	// yet; wait for it rather than read it as empty.
	for {
		var ends kadm.ListedOffsets
		if readCommitted {
			ends, err = adm.ListCommittedOffsets(ctx, s.topic)
		} else {
			ends, err = adm.ListEndOffsets(ctx, s.topic)
		}
		if err == nil {
			err = ends.Error()
		}
		switch {
		case errors.Is(err, kerr.UnknownTopicOrPartition) && s.readOnly:
			return nil, nil
		case err == nil:
			return ends, nil
		case !errors.Is(err, kerr.UnknownTopicOrPartition) || ctx.Err() != nil:
			return nil, fmt.Errorf("read the end of checkpoint topic %q: %w", s.topic, err)
		}
		time.Sleep(100 * time.Millisecond) // the retry's pace, not a synchronisation
	}
}

// take reads one record of the checkpoint topic into out (checkpoints, by
// key) and raw (every record's value, when not nil). A record that is not
// signed, or not a checkpoint the connector wrote, is skipped and
// counted, not fatal, or anyone who may write the topic could stop every
// start (docs/design.md, "Untrusted input stays data").
func (s *Store) take(r *kgo.Record, out map[string]Record, raw map[string][]byte) {
	if r.Attrs.IsControl() {
		return
	}
	checkpoint := strings.Count(string(r.Key), "/") == 1
	if checkpoint && !s.signed(r) {
		// Not signed with checkpoint.signing_key_file's key: not the
		// connector's or the operator's. The key's last genuine record
		// stands.
		s.foreign("skipped a record in the checkpoint topic that is not signed with checkpoint.signing_key_file's key; only the connector and the operator should write this topic", "key", string(r.Key), "partition", r.Partition, "offset", r.Offset)
		return
	}
	if r.Value == nil { // a tombstone deletes the key
		delete(out, string(r.Key))
		return
	}
	if raw != nil {
		raw[string(r.Key)] = r.Value
	}
	if !checkpoint {
		return // a backfill request, a fence
	}
	var rec Record
	if err := json.Unmarshal(r.Value, &rec); err != nil || rec.Key() != string(r.Key) {
		s.foreign("skipped a record in the checkpoint topic that is not a checkpoint; only the connector and the operator should write this topic", "partition", r.Partition, "offset", r.Offset)
		return
	}
	if prev, ok := out[string(r.Key)]; ok && rec.Seq < prev.Seq {
		// Each record is its predecessor's Seq plus one: one that goes
		// back is an older record produced again (or a connector older
		// than Seq writing after a newer one), and taking it would move
		// the pipeline back, undo a rewind, or bring back marks of a
		// history since left.
		s.foreign("skipped a checkpoint record that goes back (an older record written again): the newer one stands; only the connector and the operator should write this topic",
			"key", string(r.Key), "partition", r.Partition, "offset", r.Offset, "seq", rec.Seq, "newest_seq", prev.Seq)
		return
	}
	out[string(r.Key)] = rec
}

// foreign logs and counts a record someone else wrote to the topic.
func (s *Store) foreign(msg string, args ...any) {
	if s.log != nil {
		s.log.Warn(msg, append([]any{"topic", s.topic}, args...)...)
	}
	if s.OnForeign != nil {
		s.OnForeign()
	}
}
