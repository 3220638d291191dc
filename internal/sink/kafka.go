package sink

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/opt"
)

// Config configures the Kafka producer. Its YAML keys are the config
// file's kafka section (docs/config.md); the fields without one are the
// pipeline's to set (config.Config.Producer).
type Config struct {
	// Brokers are the seed brokers, host:port. Required.
	Brokers []string `yaml:"brokers"`
	// ClientID is sent to the brokers. Default DefaultClientID.
	ClientID string `yaml:"client_id"`
	// ClientLog is the least level of franz-go's own lines that are
	// logged: "error" (the default), "warn", "info" or "debug" (every
	// request on the wire). It is separate from the connector's log
	// level, so that debug or trace logging of the pipeline does not
	// bury it in wire traffic. The file's log.kafka.
	ClientLog string `yaml:"-"`
	// MaxMessageBytes is the largest record batch the producer builds,
	// mirroring the broker's message.max.bytes. A record larger than this
	// fails with MESSAGE_TOO_LARGE. Default DefaultMaxMessageBytes
	// (1,000,012, Kafka's default).
	MaxMessageBytes int32 `yaml:"max_message_bytes"`
	// DeadLetterMaxMessageBytes is the record size limit of the
	// dead-letter topics; to dead-letter oversized events it must exceed
	// MaxMessageBytes. Default DefaultMaxMessageBytes.
	DeadLetterMaxMessageBytes int32 `yaml:"dead_letter_max_message_bytes"`
	// TopicMaxMessageBytes overrides MaxMessageBytes for some topics; the
	// pipeline sets the dead-letter topics' limit here.
	TopicMaxMessageBytes map[string]int32 `yaml:"-"`
	// TopicConfigs adds configs to some topics the connector creates, over
	// TopicDefaults.Configs (a parked topic's retention).
	TopicConfigs map[string]map[string]string `yaml:"-"`
	// CreateTopics creates a missing topic through the admin API, with
	// TopicDefaults, before its first record. Default true.
	CreateTopics  opt.Value[bool] `yaml:"create_topics"`
	TopicDefaults TopicDefaults   `yaml:"topic_defaults"`
	// AllowAutoTopicCreation asks the broker to create missing topics, as
	// the Java producer does, where the connector may not create them; the
	// broker's auto.create.topics.enable still decides. Default true.
	AllowAutoTopicCreation opt.Value[bool] `yaml:"allow_auto_topic_creation"`
	// Linger is how long a partition waits for more records before it
	// sends a batch. Default 0: send at once; records still batch while
	// an earlier request is in flight, so a backlog drains in large
	// batches. franz-go's own default (10ms) would add 10ms to every
	// event's latency on a quiet outbox.
	Linger time.Duration `yaml:"linger"`
	// TLS and SASL say how to reach secured brokers.
	TLS  TLSConfig  `yaml:"tls"`
	SASL SASLConfig `yaml:"sasl"`
	// MaxBatchDelay is the least time between two batches Send lets go,
	// and so the longest an event waits to join one (see Send), at most
	// 1s. Default DefaultMaxBatchDelay; 0 sends every event at once, and so
	// does a transactional producer, whatever it says (batchDelay).
	MaxBatchDelay opt.Value[time.Duration] `yaml:"max_batch_delay"`
	// TransactionalID, when set, makes the producer transactional, for
	// exactly-once delivery: records go only inside BeginTxn and
	// CommitTxn, and a second producer with the same id fences this one.
	// TransactionTimeout is how long a transaction may stay open;
	// DefaultTransactionTimeout when 0.
	TransactionalID    string        `yaml:"-"`
	TransactionTimeout time.Duration `yaml:"-"`
	// MaxBufferedRecords bounds the records franz-go holds; Produce blocks
	// while it is full. The pipeline sets it to twice its in-flight limit,
	// so that Produce never blocks the replication loop. Default
	// DefaultMaxBufferedRecords.
	MaxBufferedRecords int `yaml:"-"`
	// ExactlyOnce says the pipeline delivers exactly once: records wait
	// for their transaction's commit anyway, so Send does not hold them to
	// pace requests (MaxBatchDelay is off), and franz-go's linger paces
	// them instead, MaxBatchDelay long (unless Linger is set), which a
	// commit's flush cuts short (linger). Without either each record goes
	// as soon as the broker answered the last request, in many more
	// requests for more CPU (docs/benchmarks.md, "Exactly-once").
	ExactlyOnce bool `yaml:"-"`
}

// Validate reports a configuration error and fills the defaults. New
// expects a validated Config.
func (c *Config) Validate() error {
	if c.ClientID == "" {
		c.ClientID = DefaultClientID
	}
	switch c.ClientLog {
	case "":
		c.ClientLog = "error"
	case "error", "warn", "info", "debug":
	default:
		return fmt.Errorf("log.kafka %q: use error, warn, info or debug", c.ClientLog)
	}
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if c.MaxBufferedRecords == 0 {
		c.MaxBufferedRecords = DefaultMaxBufferedRecords
	}
	if c.DeadLetterMaxMessageBytes == 0 {
		c.DeadLetterMaxMessageBytes = DefaultMaxMessageBytes
	}
	if c.TopicDefaults.Partitions == 0 {
		c.TopicDefaults.Partitions = -1
	}
	if c.TopicDefaults.ReplicationFactor == 0 {
		c.TopicDefaults.ReplicationFactor = -1
	}
	if c.TopicDefaults.Partitions < -1 || c.TopicDefaults.ReplicationFactor < -1 {
		return errors.New("kafka.topic_defaults: partitions and replication_factor must be positive (or -1 for the broker's default)")
	}
	if len(c.Brokers) == 0 {
		return errors.New("kafka.brokers is empty; list at least one broker as host:port, or set CDC_KAFKA_BROKERS")
	}
	for _, b := range c.Brokers {
		if err := HostPort(b); err != nil {
			return fmt.Errorf("kafka.brokers: %v", err)
		}
	}
	if err := c.validateSecurity(); err != nil {
		return err
	}
	if c.TransactionalID != "" && c.TransactionTimeout == 0 {
		c.TransactionTimeout = DefaultTransactionTimeout
	}
	if d := c.MaxBatchDelay.Or(DefaultMaxBatchDelay); d > time.Second || d < 0 {
		return fmt.Errorf("kafka.max_batch_delay %s: use a value from 0 (off) to 1s", d)
	}
	if c.Linger < 0 || c.Linger > time.Minute {
		return fmt.Errorf("kafka.linger %s: use a value from 0 to 1m", c.Linger)
	}
	if c.MaxMessageBytes < 512 || c.MaxMessageBytes > 1<<30 {
		return fmt.Errorf("kafka.max_message_bytes = %d; it must be between 512 and 1073741824", c.MaxMessageBytes)
	}
	return nil
}

// batchDelay is the least time between two batches Send lets go: 0 sends
// each record at once. A transactional producer's records wait for the
// transaction's commit anyway, and holding them to pace requests would only
// delay that commit.
func (c Config) batchDelay() time.Duration {
	if c.ExactlyOnce || c.TransactionalID != "" {
		return 0
	}
	return c.MaxBatchDelay.Or(DefaultMaxBatchDelay)
}

// linger is franz-go's linger: Linger, or, delivering exactly once,
// MaxBatchDelay (see ExactlyOnce).
func (c Config) linger() time.Duration {
	if c.Linger != 0 || !c.ExactlyOnce {
		return c.Linger
	}
	return c.MaxBatchDelay.Or(DefaultMaxBatchDelay)
}

// AutoCreate is AllowAutoTopicCreation, its default applied.
func (c Config) AutoCreate() bool { return c.AllowAutoTopicCreation.Or(true) }

// Creates is CreateTopics, its default applied.
func (c Config) Creates() bool { return c.CreateTopics.Or(true) }

// DefaultMaxBatchDelay is MaxBatchDelay's default: a small part of a
// latency budget of tens of milliseconds, and long enough that a steady
// stream goes in a few requests a batch time instead of one an event.
const DefaultMaxBatchDelay = 5 * time.Millisecond

// DefaultClientID is ClientID's default.
const DefaultClientID = "outbox-cdc"

// DefaultMaxBufferedRecords is MaxBufferedRecords' default.
const DefaultMaxBufferedRecords = 10_000

// DefaultMaxMessageBytes is Kafka's default message.max.bytes.
const DefaultMaxMessageBytes = 1_000_012

// Kafka is an idempotent franz-go producer.
type Kafka struct {
	cl     *kgo.Client
	cfg    Config
	log    hclog.Logger
	topics map[string]topicState // read and written by EnsureTopic's goroutine only
	// partitions are the partition counts of the topics pinned records
	// went to (Partitions), read and written by the same goroutine.
	partitions map[string]partitionCount
	batch      batcher
	// parked are the topics HoldParked gave the dead-letter limit; read
	// on franz-go's goroutines too.
	parked atomic.Pointer[map[string]bool]
}

// MaxMessageBytesOf is the largest record the producer sends to topic.
func (c Config) MaxMessageBytesOf(topic string) int32 {
	if n, ok := c.TopicMaxMessageBytes[topic]; ok {
		return n
	}
	return c.MaxMessageBytes
}

// New creates the producer from a validated cfg. It does not connect until
// the first record or Ping. extra options are appended last (tests use them
// for short timeouts).
func New(cfg Config, log hclog.Logger, extra ...kgo.Opt) (*Kafka, error) {
	k := &Kafka{cfg: cfg, log: log, topics: map[string]topicState{}, partitions: map[string]partitionCount{},
		batch: batcher{now: time.Now, delay: cfg.batchDelay()}}
	opts := append(ClientOpts(cfg, log),
		// Idempotence is franz-go's default; acks=all is required by it.
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.StopProducerOnDataLossDetected(),
		// A batch never exceeds its topic's limit: the broker checks
		// max.message.bytes against whole batches.
		kgo.ProducerBatchMaxBytesFn(k.maxOf),
		kgo.MaxBufferedRecords(cfg.MaxBufferedRecords),
		// franz-go's default, except for a record a table's expression
		// pinned to a partition (Pin).
		kgo.RecordPartitioner(partitioner()),
		kgo.ProducerLinger(cfg.linger()),
		// A topic just created is in the brokers' metadata a moment
		// later: seconds on a starved broker. franz-go counts an
		// unknown-topic try per metadata refresh, not per second, and
		// each new topic forces a refresh, so under a stream of new
		// topics the tries run out in a fraction of the time they would
		// on a quiet client (docs/design.md, "New topics"). 600 tries are
		// at least 6 s (refreshes are 10 ms apart at the most) and
		// minutes on a quiet client; EnsureTopic already refused a topic
		// that neither the connector nor the brokers will create, so what
		// the count still ends is a topic deleted under the connector: the
		// session ends and the next one creates it again.
		kgo.UnknownTopicRetries(600),
		// And look again soon: franz-go re-asks every 250ms for 2s, then
		// waits MetadataMinAge (5s by default) between tries, which on a
		// busy broker put a new topic's first records seconds late. The
		// floor only spaces out refreshes an error asked for; the periodic
		// refresh stays at MetadataMaxAge.
		kgo.MetadataMinAge(250*time.Millisecond), // pinned by TestNewTopicMetadataRetriesStayQuick
	)
	if cfg.AutoCreate() {
		opts = append(opts, kgo.AllowAutoTopicCreation())
	}
	if cfg.TransactionalID != "" {
		opts = append(opts, kgo.TransactionalID(cfg.TransactionalID), kgo.TransactionTimeout(cfg.TransactionTimeout))
	}
	opts = append(opts, extra...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("create kafka client: %w", err)
	}
	k.cl = cl
	return k, nil
}

// HoldParked gives topics, which parkings hold records in, the parked
// topics' record limit (DeadLetterMaxMessageBytes), as TopicMaxMessageBytes
// gives it to today's: a table's parked_topic changed, or its on_invalid
// changed away from park, while a key was still parked there, and the
// key's later records, as large as in any parked topic, go on joining its
// parking there. Call it before the first record to those topics (the
// producer reads a topic's limit as it first meets the topic).
func (k *Kafka) HoldParked(topics []string) {
	m := map[string]bool{}
	for _, t := range topics {
		m[t] = true
	}
	k.parked.Store(&m)
}

// maxOf is the largest record the producer sends to topic.
func (k *Kafka) maxOf(topic string) int32 {
	if m := k.parked.Load(); m != nil && (*m)[topic] {
		return max(k.cfg.DeadLetterMaxMessageBytes, k.cfg.MaxMessageBytesOf(topic))
	}
	return k.cfg.MaxMessageBytesOf(topic)
}

// larger reports whether topic has a limit of its own: a dead-letter or
// a parked topic's.
func (k *Kafka) larger(topic string) bool {
	_, ok := k.cfg.TopicMaxMessageBytes[topic]
	m := k.parked.Load()
	return ok || m != nil && (*m)[topic]
}

// ClientOpts are the options every client of the cluster shares: the
// producer, the checkpoint store's reader and the admin calls. They say how
// to reach, authenticate to and talk to the brokers, not how to produce.
// cfg must have been validated; a certificate file that went missing since
// is reported by the first connection.
func ClientOpts(cfg Config, log hclog.Logger) []kgo.Opt {
	opts := []kgo.Opt{
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.ClientID(cfg.ClientID),
		kgo.WithLogger(logAdapter{log, clientLogLevel(cfg.ClientLog)}),
	}
	sec, err := securityOpts(cfg)
	if err != nil {
		// Fail every connection with the reason rather than silently
		// connect without TLS.
		return append(opts, kgo.Dialer(func(context.Context, string, string) (net.Conn, error) { return nil, err }))
	}
	return append(opts, sec...)
}

// Produce hands rec to franz-go and calls done exactly once with Kafka's
// answer: nil once the record is acknowledged by all in-sync replicas, or a
// *ProduceError. done runs on franz-go's promise goroutine and must not
// block.
func (k *Kafka) Produce(rec *kgo.Record, done func(error)) {
	// context.Background: records are never cancelled (see doc.go).
	k.cl.Produce(context.Background(), rec, func(r *kgo.Record, err error) {
		if err != nil && k.Transactional() && fenced(err) {
			done(&FencedError{TransactionalID: k.cfg.TransactionalID, Err: err})
			return
		}
		done(k.produceError(r, err))
	})
}

func (k *Kafka) produceError(r *kgo.Record, err error) error {
	if err == nil {
		return nil
	}
	return &ProduceError{Topic: r.Topic, Partition: r.Partition, Size: len(r.Key) + len(r.Value), Err: err, deadLetter: k.larger(r.Topic)}
}

// Flush sends what Send holds, then waits until every produced record has
// its answer, or ctx is done; then it returns ctx's error and the records
// stay in flight. Call it from the goroutine that calls Send.
func (k *Kafka) Flush(ctx context.Context) error {
	k.Release(time.Time{})
	return k.cl.Flush(ctx)
}

// Ping checks that a broker answers and accepts the connector's TLS and
// SASL settings, with ctx as the deadline. A failure a setting must fix is
// a *ConnectError naming it.
func (k *Kafka) Ping(ctx context.Context) error {
	if err := classifyConnect(k.cfg, k.cl.Ping(ctx)); err != nil {
		var ce *ConnectError
		if errors.As(err, &ce) {
			return err
		}
		return fmt.Errorf("reach kafka brokers: %w", err)
	}
	return nil
}

// ConnectTimeout bounds Connect's wait for a broker's answer.
const ConnectTimeout = 15 * time.Second

// Connect creates the producer (New) and waits, up to ConnectTimeout,
// until a broker answers (Ping). A failure a setting must fix is a
// *ConnectError; any other says to check the brokers.
func Connect(ctx context.Context, cfg Config, log hclog.Logger, extra ...kgo.Opt) (*Kafka, error) {
	k, err := New(cfg, log, extra...)
	if err != nil {
		return nil, err
	}
	pctx, cancel := context.WithTimeout(ctx, ConnectTimeout)
	err = k.Ping(pctx)
	cancel()
	if err != nil {
		k.Close()
		if !errors.As(err, new(*ConnectError)) {
			return nil, fmt.Errorf("%w; check kafka.brokers (or CDC_KAFKA_BROKERS) and that the brokers are up", err)
		}
		return nil, err
	}
	return k, nil
}

// Close closes the client. Records still in flight fail with
// kgo.ErrClientClosed; their transactions are never confirmed.
func (k *Kafka) Close() { k.cl.Close() }

// ProduceError is Kafka's refusal of one record, with advice.
type ProduceError struct {
	Topic     string
	Partition int32
	Size      int
	Err       error
	// deadLetter: the topic is a dead-letter topic, whose size limit is
	// kafka.dead_letter_max_message_bytes.
	deadLetter bool
	// permanent and advice, when set, override what Err implies.
	permanent bool
	advice    string
}

func (e *ProduceError) Error() string {
	msg := fmt.Sprintf("produce to kafka topic %q: %v", e.Topic, e.Err)
	if e.advice != "" {
		return msg + "; " + e.advice
	}
	switch {
	case (errors.Is(e.Err, kerr.MessageTooLarge) || errors.Is(e.Err, kerr.RecordListTooLarge)) && e.deadLetter:
		msg += fmt.Sprintf("; the dead-letter record (key+value %d bytes) is larger than the dead-letter topic allows: raise its max.message.bytes and kafka.dead_letter_max_message_bytes", e.Size)
	case errors.Is(e.Err, kerr.MessageTooLarge), errors.Is(e.Err, kerr.RecordListTooLarge):
		msg += fmt.Sprintf("; the record (key+value %d bytes) is larger than the producer or topic allows: raise the topic's max.message.bytes and kafka.max_message_bytes, or make the payload smaller", e.Size)
	case errors.Is(e.Err, kerr.UnknownTopicOrPartition):
		msg += "; the topic is not (yet) in the brokers' metadata: it was just created, or is being auto-created, or was deleted; the connector retries"
	case errors.Is(e.Err, kerr.TopicAuthorizationFailed), errors.Is(e.Err, kerr.ClusterAuthorizationFailed), errors.Is(e.Err, kerr.TransactionalIDAuthorizationFailed):
		msg += "; grant the connector's principal WRITE on the topic and IDEMPOTENT_WRITE on the cluster"
	case errors.Is(e.Err, kerr.InvalidTopicException):
		msg += "; the broker rejects this topic name: check the table's topic template"
	}
	return msg
}

func (e *ProduceError) Unwrap() error { return e.Err }

// Permanent reports whether retrying the same record cannot succeed, so the
// connector should stop instead of reconnecting. A missing topic is not: it
// may be being created; EnsureTopic reports one that cannot be.
func (e *ProduceError) Permanent() bool {
	if e.permanent {
		return true
	}
	var dataLoss *kgo.ErrDataLoss
	switch {
	case errors.As(e.Err, &dataLoss):
		return true
	case errors.Is(e.Err, kgo.ErrClientClosed):
		return false
	}
	var ke *kerr.Error
	if errors.As(e.Err, &ke) {
		switch ke {
		case kerr.MessageTooLarge, kerr.RecordListTooLarge,
			kerr.TopicAuthorizationFailed, kerr.ClusterAuthorizationFailed,
			kerr.InvalidTopicException, kerr.InvalidRecord, kerr.PolicyViolation,
			kerr.UnsupportedForMessageFormat, kerr.InvalidRequiredAcks:
			return true
		}
		return false
	}
	return false
}

// logAdapter sends franz-go's logs to hclog, so the process has one logger.
type logAdapter struct {
	l     hclog.Logger
	level kgo.LogLevel
}

// franz-go's lines are off below Config.ClientLog, whatever the
// connector's own level: at info and warn they are metadata refreshes,
// producer ids and one line per retry while a broker is down, and the
// pipeline reports a stalled Kafka itself, once, and again when it
// recovers. When asked for, they are logged at info (errors and warnings
// at their own level), so that log.level need not change to see them.
func (a logAdapter) Level() kgo.LogLevel { return a.level }

func (a logAdapter) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	if msg != "" {
		msg = strings.ToLower(msg[:1]) + msg[1:]
	}
	switch level {
	case kgo.LogLevelError:
		a.l.Error(msg, keyvals...)
	case kgo.LogLevelWarn:
		a.l.Warn(msg, keyvals...)
	default:
		a.l.Info(msg, keyvals...)
	}
}

func clientLogLevel(s string) kgo.LogLevel {
	switch s {
	case "debug":
		return kgo.LogLevelDebug
	case "info":
		return kgo.LogLevelInfo
	case "warn":
		return kgo.LogLevelWarn
	}
	return kgo.LogLevelError
}

// HostPort checks that addr is host:port with a port from 1 to 65535 (an
// empty host is every address, for a listener).
func HostPort(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q is not host:port (such as kafka-1:9092 or [::1]:9092)", addr)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("%q: port %q is not a number from 1 to 65535", addr, port)
	}
	return nil
}

// MaxMessageBytesOf is the largest record the producer sends to topic: a
// larger one would fail with MESSAGE_TOO_LARGE.
func (k *Kafka) MaxMessageBytesOf(topic string) int { return int(k.maxOf(topic)) }
