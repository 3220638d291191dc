package config

import (
	"errors"
	"fmt"
	"time"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/opt"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/postgres"
	"github.com/outboxcdc/cdc/internal/route"
	"github.com/outboxcdc/cdc/internal/schema"
	"github.com/outboxcdc/cdc/internal/setup"
	"github.com/outboxcdc/cdc/internal/sink"
)

// ParkedTopicConfigs are the configs of a parked topic the connector
// creates: nothing is deleted from it by time or size.
var ParkedTopicConfigs = map[string]string{"retention.ms": "-1", "retention.bytes": "-1"}

// DefaultMaxParkedKeys is max_parked_keys' default: room for an incident's
// worth of aggregates, small enough to keep in every checkpoint record.
const DefaultMaxParkedKeys = 1000

// DefaultMaxInFlight is max_in_flight's default. It bounds the connector's
// memory (about 2 KB per event in flight, for the row, the record and
// franz-go's batch). An event waits for the produce request in flight to
// the broker (one at a time: franz-go's idempotent producer allows no
// more) and then for its own, about two round trips, so a far broker
// needs more: docs/benchmarks.md, "A network to the broker", has what
// each value carries.
const DefaultMaxInFlight = 4096

// DefaultMaxInFlightBytes is max_in_flight_bytes's default: 64 MiB of
// records waiting for Kafka, which franz-go's batches, the decoded rows and
// the records each hold once: a bound on the connector's memory however
// large the payloads (docs/benchmarks.md has what it comes to).
const DefaultMaxInFlightBytes = 64 << 20

// DefaultUnhealthyAfter is Config.UnhealthyAfter's default: ten of the
// longest reconnect backoffs, so that a restart is asked for only after
// many retries have failed.
const DefaultUnhealthyAfter = 5 * time.Minute

// Defaults of Config's own fields; each stage's config states its own.
const (
	DefaultShutdownTimeout  = 30 * time.Second
	DefaultRetryBackoff     = time.Second
	DefaultRetryBackoffMax  = 30 * time.Second
	DefaultStatementTimeout = 5 * time.Minute
	DefaultCommitEvents     = 10_000
	DefaultCommitInterval   = 100 * time.Millisecond
)

// Config configures a pipeline: what Load reads, and what pipeline.New
// takes. The config file is decoded into it (its YAML keys, and the
// stages' configs' own: docs/config.md); the fields without a key Load
// fills from the file's other sections (tables, schema_registry, reconnect,
// http, log).
type Config struct {
	// Name is the pipeline's, for the pipeline label of its metrics and
	// cdc status. Default: the slot's name.
	Name     string           `yaml:"name"`
	Postgres postgres.Config  `yaml:"postgres"`
	Kafka    sink.Config      `yaml:"kafka"`
	Tables   []*outbox.Source `yaml:"-"`
	// SchemaRegistry is where tables with a schema (json-schema, avro,
	// protobuf) find it.
	SchemaRegistry schema.Config `yaml:"-"`
	// MaxInFlight is how many events may wait for Kafka's ack before the
	// replication loop stops reading. Default DefaultMaxInFlight.
	MaxInFlight int `yaml:"max_in_flight"`
	// MaxInFlightBytes is how many bytes of records may wait for Kafka's ack
	// before the replication loop stops reading, whichever of the two limits
	// comes first: with large payloads the count alone let a broker stall fill
	// the memory (docs/design.md, "Memory is bounded in bytes"). Default
	// DefaultMaxInFlightBytes (64 MiB); one record is always let through.
	MaxInFlightBytes int64 `yaml:"max_in_flight_bytes"`
	// MaxParkedKeys bounds the keys on_invalid: park holds back at once,
	// in all the tables: one more stops the connector as on_invalid: fail
	// would, never drops. Default DefaultMaxParkedKeys.
	MaxParkedKeys int `yaml:"max_parked_keys"`
	// ShutdownTimeout bounds a shutdown: the stream reads on to the end of
	// the open transaction for at most half of it, and the wait for
	// Kafka's acks and the last checkpoint ends with it. Default
	// DefaultShutdownTimeout.
	ShutdownTimeout time.Duration `yaml:"shutdown_timeout"`
	// RetryBackoff is the first delay before reconnecting after a transient
	// error; it doubles up to RetryBackoffMax. Each wait is jittered over
	// its second half. Defaults DefaultRetryBackoff and
	// DefaultRetryBackoffMax (reconnect.backoff and reconnect.backoff_max).
	RetryBackoff    time.Duration `yaml:"-"`
	RetryBackoffMax time.Duration `yaml:"-"`
	// Checkpoint is where the pipeline keeps its durable progress.
	Checkpoint CheckpointConfig `yaml:"checkpoint"`
	// Replay keeps WAL for replays and rewinds.
	Replay ReplayConfig `yaml:"replay"`
	// Backfill configures every backfill's statements.
	Backfill BackfillConfig `yaml:"backfill"`
	// Standby configures how an instance that finds the slot in use
	// takes over from a holder that went silent.
	Standby StandbyConfig `yaml:"standby"`
	// UnhealthyAfter is how long the pipeline may go without streaming,
	// other than as a standby watching a live holder, before Healthy
	// fails: /healthz then answers 503 so that an orchestrator restarts a
	// process that is stuck (a connection that never comes back, say).
	// Default DefaultUnhealthyAfter (http.unhealthy_after).
	UnhealthyAfter time.Duration `yaml:"-"`
	// Delivery is DeliveryAtLeastOnce (the default) or
	// DeliveryExactlyOnce, which ExactlyOnce configures.
	Delivery    string            `yaml:"delivery"`
	ExactlyOnce ExactlyOnceConfig `yaml:"exactly_once"`
}

// CheckpointConfig configures the checkpoint store.
type CheckpointConfig struct {
	// Topic is the compacted Kafka topic of the checkpoints, created when
	// missing. Default checkpoint.DefaultTopic ("outbox-cdc.checkpoints").
	Topic string `yaml:"topic"`
	// SigningKeyFile holds the signing keys, one a line; Load reads them
	// into SigningKeys.
	SigningKeyFile string `yaml:"signing_key_file"`
	// SigningKeys sign backfill requests (the first) and verify them (any):
	// SigningKeyFile's lines. Without them cdc backfill refuses to ask and
	// cdc run ignores requests.
	SigningKeys [][]byte `yaml:"-"`
}

// BackfillConfig configures the statements backfills run.
type BackfillConfig struct {
	// StatementTimeout cancels a backfill statement (a chunk, a count)
	// that runs longer: a condition is the operator's, and runs as a role
	// that can read every table. Default DefaultStatementTimeout
	// (backfill.statement_timeout).
	StatementTimeout time.Duration `yaml:"statement_timeout"`
	// ReaderRole, when set, is the role every statement that carries a
	// condition runs as (SET LOCAL ROLE): one that may only read the
	// outbox tables, without REPLICATION, so that a condition can neither
	// read other tables nor touch slots or other sessions
	// (backfill.reader_role; docs/security.md). The connector's role must
	// be a member of it. Default none: the connector's role.
	ReaderRole string `yaml:"reader_role"`
	// OnUnknownOrder is what the reads before the stream (a first start's
	// backfill of several tables) do where the tables do not tell an
	// aggregate's order across them: OnUnknownOrderStop (default) stops
	// and says so, OnUnknownOrderSend sends them anyway: the tables in
	// order_by first, then the others merged, table by table within a commit
	// (backfill.on_unknown_order; docs/operations.md, "Backfills of two
	// outbox tables").
	OnUnknownOrder string `yaml:"on_unknown_order"`
}

// The values of backfill.on_unknown_order.
const (
	OnUnknownOrderStop = "stop"
	OnUnknownOrderSend = "send"
)

// ReplayConfig configures the replay window.
type ReplayConfig struct {
	// Window is how far back cdc replay and cdc rewind can reach. The
	// pipeline keeps a second slot, "<slot>_replay", that far behind, so
	// Postgres retains that much WAL. Default 0: no window, no second
	// slot. At least 1s when set.
	Window time.Duration `yaml:"window"`
}

// ReplaySlot is the replay window's slot.
func (c *Config) ReplaySlot() string { return c.Postgres.Slot + "_replay" }

// Validate fills defaults and reports the first configuration error. Each
// stage's config validates itself and owns its defaults; Validate adds the
// rules that tie stages together. New calls it: call it yourself only to
// check a config without building a pipeline.
func (c *Config) Validate() error {
	for _, step := range []func() error{
		c.validateTables, c.validateRegistry, c.Postgres.Validate, c.validateDelivery, c.validateStandby,
		c.validateInFlight, c.Kafka.Validate, c.validateTimes, c.validateCheckpoint, c.validateNames,
	} {
		if err := step(); err != nil {
			return err
		}
	}
	return nil
}

// validateTables validates each table, on copies: tables shared with a
// pipeline already running (a replay next to the stream, in one process)
// are never written while that pipeline reads them.
func (c *Config) validateTables() error {
	if len(c.Tables) == 0 {
		return errors.New("tables is empty; configure at least one outbox table")
	}
	c.Postgres.Messages = false
	tables := make([]*outbox.Source, len(c.Tables))
	for i, t := range c.Tables {
		tables[i] = t.Clone()
	}
	c.Tables = tables
	seen := map[string]bool{}
	for _, t := range c.Tables {
		if err := t.Validate(); err != nil {
			return err
		}
		if seen[t.String()] {
			return fmt.Errorf("%s is configured twice", t)
		}
		seen[t.String()] = true
		if t.IsMessage() {
			c.Postgres.Messages = true
		}
		if t.Backfill != nil && t.Backfill.ChunkSize > c.MaxInFlight && c.MaxInFlight > 0 {
			return fmt.Errorf("%s: backfill.chunk_size %d is more than max_in_flight %d; lower it", t, t.Backfill.ChunkSize, c.MaxInFlight)
		}
	}
	return nil
}

// validateRegistry checks the registry and the tables' schemas.
func (c *Config) validateRegistry() error {
	if c.SchemaRegistry.AutoRegister {
		for _, t := range c.Tables {
			if t.Schema.File != "" && t.TopicFromRow() {
				// Subjects follow topics, which a row's fields choose:
				// whoever may insert a row would create subjects at will.
				topic := "topic " + t.Topic
				if t.Expressions.Topic != "" {
					topic = "expressions.topic " + t.Expressions.Topic
				}
				return fmt.Errorf("%s: schema_registry.auto_register with a topic that a row's fields choose (%s) lets whoever inserts rows create registry subjects at will; register the subjects yourself and turn auto_register off, or use a fixed topic", t, topic)
			}
		}
	}
	if err := c.SchemaRegistry.Validate(c.UsesRegistry()); err != nil {
		return err
	}
	for _, t := range c.Tables {
		if t.Schema.File != "" {
			if err := schema.CheckFile(&t.Schema); err != nil {
				return fmt.Errorf("%s: %w", t, err)
			}
		}
	}
	return nil
}

// validateInFlight fills and checks the bounds on what waits for Kafka.
func (c *Config) validateInFlight() error {
	if c.MaxInFlight == 0 {
		c.MaxInFlight = DefaultMaxInFlight
	}
	if c.MaxInFlight < 1 {
		return fmt.Errorf("max_in_flight %d: use at least 1", c.MaxInFlight)
	}
	if c.MaxInFlight > 1_000_000 {
		return fmt.Errorf("max_in_flight %d: use at most 1000000; memory is bounded by max_in_flight_bytes too", c.MaxInFlight)
	}
	if c.MaxInFlightBytes == 0 {
		c.MaxInFlightBytes = DefaultMaxInFlightBytes
	}
	if c.MaxParkedKeys == 0 {
		c.MaxParkedKeys = DefaultMaxParkedKeys
	}
	if c.MaxParkedKeys < 1 || c.MaxParkedKeys > 100_000 {
		return fmt.Errorf("max_parked_keys %d: use 1 to 100000", c.MaxParkedKeys)
	}
	if c.MaxInFlightBytes < 1<<20 {
		return fmt.Errorf("max_in_flight_bytes %d: use at least 1048576 (1 MiB); the default is %d", c.MaxInFlightBytes, DefaultMaxInFlightBytes)
	}
	return nil
}

// Producer is the producer's settings: kafka.*, and what the other stages
// decide: the delivery mode, a buffer above the in-flight limit, and the
// dead-letter topics' size limit. It changes nothing in c; call it on a
// validated Config.
func (c *Config) Producer() sink.Config {
	k := c.Kafka
	if c.IsExactlyOnce() {
		// The session's producer gets its transactional id, which names
		// the database system, when it connects.
		k.ExactlyOnce = true
		k.TransactionTimeout = c.ExactlyOnce.TransactionTimeout
	}
	// franz-go's Produce blocks when its buffer is full, which would block
	// the replication loop and its status updates: keep the buffer above
	// the in-flight limit.
	k.MaxBufferedRecords = 2 * c.MaxInFlight
	k.TopicMaxMessageBytes = map[string]int32{}
	k.TopicConfigs = map[string]map[string]string{}
	for _, t := range c.Tables {
		// Every table's dead-letter topic, whatever its on_invalid: cdc
		// skip sends there the event a fail table stopped on (one too large
		// for its topic included), and cdc redrive --drop-first and
		// --drop-invalid a park table's.
		k.TopicMaxMessageBytes[t.DeadLetterTopic] = k.DeadLetterMaxMessageBytes
		if t.OnInvalid == outbox.OnInvalidPark {
			// A parked event lives in its topic until it is redriven:
			// no time or size retention deletes it.
			k.TopicMaxMessageBytes[t.ParkedTopic] = k.DeadLetterMaxMessageBytes
			k.TopicConfigs[t.ParkedTopic] = ParkedTopicConfigs
		}
	}
	return k
}

// ParkedTopics are the tables' parked topics (on_invalid: park), which
// only parking's own records may reach.
func (c *Config) ParkedTopics() map[string]bool {
	topics := map[string]bool{}
	for _, t := range c.Tables {
		if t.OnInvalid == outbox.OnInvalidPark {
			topics[t.ParkedTopic] = true
		}
	}
	return topics
}

// DeadLetterTopics are the tables' dead-letter topics, which only dead
// letters may reach.
func (c *Config) DeadLetterTopics() map[string]bool {
	topics := map[string]bool{}
	for _, t := range c.Tables {
		topics[t.DeadLetterTopic] = true
	}
	return topics
}

// Registry is the Schema Registry client's settings: schema_registry.*,
// and, delivering exactly once, how long an event may wait for the
// registry: an event waiting holds its Kafka transaction open, so it gives
// up before the broker aborts it, and a new session (a new transaction)
// waits again. It changes nothing in c.
func (c *Config) Registry() schema.Config {
	r := c.SchemaRegistry
	if c.IsExactlyOnce() {
		r.WaitLimit = c.ExactlyOnce.TransactionTimeout / 2
	}
	return r
}

// validateTimes fills and checks the pipeline's timeouts and backoffs.
func (c *Config) validateTimes() error {
	if c.UnhealthyAfter == 0 {
		c.UnhealthyAfter = DefaultUnhealthyAfter
	}
	if c.UnhealthyAfter < time.Second {
		return fmt.Errorf("http.unhealthy_after %s: use at least 1s; minutes in production", c.UnhealthyAfter)
	}
	if c.Backfill.StatementTimeout == 0 {
		c.Backfill.StatementTimeout = DefaultStatementTimeout
	}
	if c.Backfill.StatementTimeout < time.Second {
		return fmt.Errorf("backfill.statement_timeout %s: use at least 1s; minutes in production", c.Backfill.StatementTimeout)
	}
	switch c.Backfill.OnUnknownOrder {
	case "":
		c.Backfill.OnUnknownOrder = OnUnknownOrderStop
	case OnUnknownOrderStop, OnUnknownOrderSend:
	default:
		return fmt.Errorf("backfill.on_unknown_order %q: use %s or %s", c.Backfill.OnUnknownOrder, OnUnknownOrderStop, OnUnknownOrderSend)
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = DefaultShutdownTimeout
	}
	if c.RetryBackoff == 0 {
		c.RetryBackoff = DefaultRetryBackoff
	}
	if c.RetryBackoffMax == 0 {
		c.RetryBackoffMax = max(DefaultRetryBackoffMax, c.RetryBackoff)
	}
	if c.RetryBackoff < 10*time.Millisecond || c.RetryBackoffMax < c.RetryBackoff {
		return fmt.Errorf("reconnect.backoff %s and backoff_max %s: use at least 10ms, and a maximum at least the first", c.RetryBackoff, c.RetryBackoffMax)
	}
	if c.Replay.Window != 0 && c.Replay.Window < time.Second {
		return fmt.Errorf("replay.window %s: use 0 (no window) or at least 1s; hours in production", c.Replay.Window)
	}
	return nil
}

// validateCheckpoint checks the checkpoint topic, which no event may
// reach: events in it would be the row writers' say over the connector's
// state (docs/design.md, "Untrusted input stays data").
func (c *Config) validateCheckpoint() error {
	if c.Checkpoint.Topic == "" {
		c.Checkpoint.Topic = checkpoint.DefaultTopic
	}
	if err := route.ValidTopic(c.Checkpoint.Topic); err != nil {
		return fmt.Errorf("checkpoint.topic: %v", err)
	}
	for _, t := range c.Tables {
		if t.Retention != nil && len(c.Checkpoint.SigningKeys) == 0 {
			// Retention deletes on what it reads back from the topic
			// (its marks, the confirmed position, what the stream
			// covered): unsigned, anyone who may write the topic could
			// have every row deleted (docs/security.md).
			return fmt.Errorf("%s: retention deletes rows on what the connector reads back from the checkpoint topic, which must then be signed: set checkpoint.signing_key_file (openssl rand -hex 32 > signing.key)", t)
		}
		if topic := t.LiteralTopic(); topic != "" && sink.SameTopic(topic, c.Checkpoint.Topic) {
			return fmt.Errorf("%s: topic %q is the checkpoint topic %q, as Kafka compares names (. and _ alike); route events elsewhere, or set checkpoint.topic to another", t, topic, c.Checkpoint.Topic)
		}
		for _, o := range c.Tables {
			// The gate keeps events out of every dead-letter topic: each
			// of this table's events would be invalid.
			if topic := t.LiteralTopic(); topic != "" && sink.SameTopic(topic, o.DeadLetterTopic) {
				return fmt.Errorf("%s: topic %q is, to Kafka, %s's dead_letter_topic, which only dead letters reach; route events elsewhere, or give that table another dead_letter_topic", t, topic, o)
			}
		}
		if t.OnInvalid == outbox.OnInvalidDeadLetter && t.DeadLetterTopic == c.Checkpoint.Topic {
			return fmt.Errorf("%s: dead_letter_topic %q is the checkpoint topic; choose another", t, t.DeadLetterTopic)
		}
		if t.OnInvalid == outbox.OnInvalidPark && t.ParkedTopic == c.Checkpoint.Topic {
			return fmt.Errorf("%s: parked_topic %q is the checkpoint topic; choose another", t, t.ParkedTopic)
		}
		if t.OnInvalid == outbox.OnInvalidPark && len(c.Checkpoint.SigningKeys) == 0 {
			// A parked key is released by cdc redrive, whose requests are
			// signed, and its parked records are sealed, so that one
			// someone else produced to the parked topic is not sent on as
			// the connector's (docs/security.md).
			return fmt.Errorf("%s: on_invalid: park seals its parked records and takes signed redrive requests: set checkpoint.signing_key_file (openssl rand -hex 32 > signing.key)", t)
		}
	}
	for _, t := range c.Tables {
		if t.OnInvalid != outbox.OnInvalidPark {
			continue
		}
		for _, o := range c.Tables {
			if topic := o.LiteralTopic(); topic == t.ParkedTopic || (o.OnInvalid == outbox.OnInvalidDeadLetter && o.DeadLetterTopic == t.ParkedTopic) {
				return fmt.Errorf("%s: the parked topic %q is also where %s sends events; choose another parked_topic", t, t.ParkedTopic, o)
			}
		}
	}
	return nil
}

// validateNames fills and checks the pipeline's name and its slots'.
func (c *Config) validateNames() error {
	if c.Name == "" {
		c.Name = c.Postgres.Slot
	}
	if !validName(c.Name) {
		return fmt.Errorf("name %q: use at most 63 letters, digits, '.', '_' and '-'", c.Name)
	}
	if len(c.ReplaySlot()) > 63 {
		return fmt.Errorf("postgres.slot %q is too long to name its replay slot %q; use at most 56 characters", c.Postgres.Slot, c.ReplaySlot())
	}
	return nil
}

// UsesRegistry reports whether a table's schema is in the registry.
func (c *Config) UsesRegistry() bool {
	for _, t := range c.Tables {
		if t.Schema.Registered() {
			return true
		}
	}
	return false
}

// WALTables lists the outbox tables (not message sources) with the columns
// the decoder reads from each, for wal's checks.
func (c *Config) WALTables() []setup.Table {
	var ts []setup.Table
	for _, t := range c.Tables {
		if t.IsMessage() {
			continue
		}
		wt := setup.Table{TableName: t.Name}
		for f, name := range t.Columns {
			if name != "" {
				wt.Columns = append(wt.Columns, name)
				wt.Fields = append(wt.Fields, outbox.FieldNames[f])
			}
		}
		for _, name := range t.Extra {
			wt.Columns = append(wt.Columns, name)
			wt.Fields = append(wt.Fields, "")
		}
		ts = append(ts, wt)
	}
	return ts
}

// Delivery modes.
const (
	DeliveryAtLeastOnce = "at-least-once"
	DeliveryExactlyOnce = "exactly-once"
)

// ExactlyOnceConfig configures exactly-once delivery.
type ExactlyOnceConfig struct {
	// CommitEvents and CommitInterval: a Kafka transaction is committed at
	// the first Postgres transaction boundary after it holds this many
	// events, or has been open this long. Defaults DefaultCommitEvents and
	// DefaultCommitInterval.
	CommitEvents   int           `yaml:"commit_events"`
	CommitInterval time.Duration `yaml:"commit_interval"`
	// TransactionTimeout is how long the broker lets a transaction stay
	// open (transaction.timeout.ms): a Postgres transaction must stream
	// within it. Default sink.DefaultTransactionTimeout; at most the
	// broker's transaction.max.timeout.ms (15m by default).
	TransactionTimeout time.Duration `yaml:"transaction_timeout"`
}

// IsExactlyOnce reports whether delivery is exactly once.
func (c *Config) IsExactlyOnce() bool { return c.Delivery == DeliveryExactlyOnce }

func (c *Config) validateDelivery() error {
	switch c.Delivery {
	case "":
		c.Delivery = DeliveryAtLeastOnce
	case DeliveryAtLeastOnce, DeliveryExactlyOnce:
	default:
		return fmt.Errorf("delivery %q: use at-least-once or exactly-once", c.Delivery)
	}
	e := &c.ExactlyOnce
	if e.CommitEvents == 0 {
		e.CommitEvents = DefaultCommitEvents
	}
	if e.CommitInterval == 0 {
		e.CommitInterval = DefaultCommitInterval
	}
	if e.TransactionTimeout == 0 {
		e.TransactionTimeout = sink.DefaultTransactionTimeout
	}
	switch {
	case e.CommitEvents < 1:
		return fmt.Errorf("exactly_once.commit_events %d: use at least 1", e.CommitEvents)
	case e.CommitInterval < time.Millisecond || e.CommitInterval > time.Minute:
		return fmt.Errorf("exactly_once.commit_interval %s: use 1ms to 1m", e.CommitInterval)
	case e.TransactionTimeout < time.Second || e.TransactionTimeout > 15*time.Minute:
		return fmt.Errorf("exactly_once.transaction_timeout %s: use 1s to 15m (and at most the brokers' transaction.max.timeout.ms)", e.TransactionTimeout)
	case e.TransactionTimeout <= 2*e.CommitInterval:
		return fmt.Errorf("exactly_once.transaction_timeout %s must be well over commit_interval %s", e.TransactionTimeout, e.CommitInterval)
	}
	return nil
}

// StandbyConfig configures takeover.
type StandbyConfig struct {
	// TakeoverAfter is how long the slot's holder may send Postgres
	// nothing before a standby ends its walsender and takes over: at
	// least three status intervals. Default DefaultTakeoverAfter, or three
	// status intervals when longer; 0 turns takeover off (a standby then
	// waits for wal_sender_timeout). Read it with Config.TakeoverAfter.
	TakeoverAfter opt.Value[time.Duration] `yaml:"takeover_after"`
}

// DefaultTakeoverAfter is StandbyConfig.TakeoverAfter's default: five
// status intervals of the default 1s, so that takeover comes within about
// 7 s of the holder freezing.
const DefaultTakeoverAfter = 5 * time.Second

// TakeoverAfter is standby.takeover_after, its default applied: 0 is off.
func (c *Config) TakeoverAfter() time.Duration {
	return c.Standby.TakeoverAfter.Or(max(DefaultTakeoverAfter, 3*c.Postgres.StatusInterval))
}

func (c *Config) validateStandby() error {
	if t := c.TakeoverAfter(); t != 0 && t < 3*c.Postgres.StatusInterval {
		return fmt.Errorf("standby.takeover_after %s: use at least three postgres.status_interval (%s), or a live holder could be taken for a frozen one", t, c.Postgres.StatusInterval)
	}
	return nil
}

// validName reports whether s is a pipeline name: a label value that reads
// well in a dashboard, a table and a Helm release.
func validName(s string) bool {
	if s == "" || len(s) > 63 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return false
		}
	}
	return true
}
