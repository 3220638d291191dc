package outbox

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outboxcdc/cdc/internal/pgident"
)

// TableName is a schema-qualified table name as Postgres stores it in the
// catalog: Schema and Name are already case-folded or unquoted.
type TableName struct {
	Schema string
	Name   string
}

// String returns the name quoted for SQL, e.g. public.outbox or
// tenant."OutboxEvent".
func (t TableName) String() string { return pgident.Qualified(t.Schema, t.Name) }

// ParseTableName parses a table name the way a user writes it in SQL:
// "outbox", "public.outbox", `tenant."OutboxEvent"`. Unquoted parts fold to
// lower case; the schema defaults to public.
func ParseTableName(s string) (TableName, error) {
	schema, name, err := pgident.ParseQualified(s)
	return TableName{Schema: schema, Name: name}, err
}

// Field is one mappable outbox field.
type Field int

// The mappable fields, in a fixed order.
const (
	FieldID Field = iota
	FieldAggregateType
	FieldAggregateID
	FieldEventType
	FieldPayload
	FieldTimestamp
	FieldVersion
	FieldTenant
	FieldTraceparent
	NumFields
)

// FieldNames are the names of the fields in config files and templates.
var FieldNames = [NumFields]string{"id", "aggregate_type", "aggregate_id", "event_type", "payload", "timestamp", "version", "tenant", "traceparent"}

// FieldByName returns the field called name.
func FieldByName(name string) (Field, bool) {
	for f, n := range FieldNames {
		if n == name {
			return Field(f), true
		}
	}
	return 0, false
}

func (f Field) String() string { return FieldNames[f] }

// Columns maps each field to a column (for a table) or a JSON member name
// (for a logical message), in catalog form. "" leaves the field unmapped.
type Columns [NumFields]string

// DefaultColumns is Debezium's Outbox Event Router convention.
var DefaultColumns = Columns{
	FieldID:            "id",
	FieldAggregateType: "aggregatetype",
	FieldAggregateID:   "aggregateid",
	FieldEventType:     "type",
	FieldPayload:       "payload",
}

// DefaultMessageFields are the JSON members read from a logical decoding
// message when the config names none.
var DefaultMessageFields = Columns{
	FieldID:            "id",
	FieldAggregateType: "aggregate_type",
	FieldAggregateID:   "aggregate_id",
	FieldEventType:     "event_type",
	FieldPayload:       "payload",
	FieldTimestamp:     "timestamp",
	FieldVersion:       "version",
	FieldTenant:        "tenant",
	FieldTraceparent:   "traceparent",
}

// Names lists the mapped column names.
func (c Columns) Names() []string {
	var n []string
	for _, name := range c {
		if name != "" {
			n = append(n, name)
		}
	}
	return n
}

// Defaults of the routing options.
const (
	DefaultTopic           = "outbox.event.{aggregate_type}"
	DefaultKey             = "{aggregate_id}"
	DefaultDeadLetterTopic = "outbox.dead-letter"
	DefaultParkedTopic     = "outbox.parked"
)

// Value formats.
const (
	FormatPayload               = "payload"
	FormatEnvelope              = "envelope"
	FormatCloudEventsBinary     = "cloudevents-binary"
	FormatCloudEventsStructured = "cloudevents-structured"
)

// Invalid-event policies.
const (
	OnInvalidFail       = "fail"
	OnInvalidDeadLetter = "dead-letter"
	// OnInvalidPark parks the invalid event's key: it and every later
	// event of the same key go to ParkedTopic, in commit order, until an
	// operator redrives them (docs/operations.md, "Parked keys").
	OnInvalidPark = "park"
)

// Placements of an additional column.
const (
	PlaceHeader   = "header"
	PlaceEnvelope = "envelope"
)

// Additional places one more column in the record.
type Additional struct {
	Column    string // catalog form (table) or JSON member (message)
	Placement string // PlaceHeader or PlaceEnvelope
	As        string // header or envelope field name; default: Column
}

// Source is one configured source of events: an outbox table, or (when
// MessagePrefix is set) transactional logical decoding messages with that
// prefix. The routing options are plain data that route reads.
//
// Validate fills the defaults and the derived fields below; after it a Source
// is read-only, and the pipeline shares it between stages.
type Source struct {
	Name          TableName // the table; zero for a message source
	MessagePrefix string    // the pg_logical_emit_message prefix; "" for a table
	Columns       Columns

	Additional []Additional

	Topic string // template; DefaultTopic
	// TopicLowercase and TopicReplaceIllegal are explicit, opt-in
	// normalisations of the expanded topic name: lower-case it, and
	// replace each character Kafka does not allow with this string. Off by
	// default: a topic is never rewritten unless asked.
	TopicLowercase      bool
	TopicReplaceIllegal string
	// MaxTopics bounds the distinct topics a templated Topic may expand
	// to: past it an event's new topic makes it invalid (on_invalid), so
	// a role that may insert rows cannot create topics without bound.
	// DefaultMaxTopics; it does not apply to a static topic.
	MaxTopics int
	Key       string // template; DefaultKey
	// Format is one of the Format constants; FormatPayload by default.
	Format string
	// Headers renames (or with "" turns off) the metadata headers, by
	// header key: id, event_type, aggregate_type, aggregate_id, commit_lsn,
	// tenant, version.
	Headers map[string]string
	// CloudEventsSource is the template of the CloudEvents source
	// attribute; default "/{schema}/{table}" or "/messages/{prefix}".
	CloudEventsSource string
	// Tombstone sends a NULL or empty payload as a null value (a Kafka
	// tombstone for the key) instead of an empty value.
	Tombstone bool
	// OnInvalid is OnInvalidFail (default), OnInvalidDeadLetter or
	// OnInvalidPark.
	OnInvalid       string
	DeadLetterTopic string
	// ParkedTopic is where on_invalid: park sends a parked key's events;
	// DefaultParkedTopic. OnInvalidUnkeyed is what park does with an
	// invalid event without a key, which cannot be parked: OnInvalidFail
	// (the default) or OnInvalidDeadLetter.
	ParkedTopic      string
	OnInvalidUnkeyed string
	// Schema is the data contract of the payload (outbox/schema.go).
	Schema Schema
	// Backfill, when set, sends the rows already in the table that match
	// its condition on the first start (docs/migrating-from-polling.md),
	// and is the default of cdc backfill for this table.
	Backfill *BackfillOptions
	// Retention, when set, has the connector delete the table's rows
	// whose events Kafka has acknowledged, once they are older than
	// Retention.After (internal/retention).
	Retention *Retention
	// Filter, when set, is a CEL expression that leaves out the events it
	// gives false for; Expressions compute the topic, key, partition and
	// headers from each event (outbox/expr.go).
	Filter      string
	Expressions Expressions

	// Derived by Validate. Extra lists the columns, besides the mapped
	// fields, that Additional and {column:NAME} placeholders need, each
	// once; the decoder extracts them into Event.Extra in this order.
	// TopicTemplate, KeyTemplate and SourceTemplate are Topic, Key and
	// CloudEventsSource parsed (TopicTemplate and KeyTemplate have no parts
	// when an expression replaces them). Programs are Filter and
	// Expressions compiled; nil when the table has neither.
	Extra          []string
	TopicTemplate  Template
	KeyTemplate    Template
	SourceTemplate Template
	Programs       *Programs
}

// validateInvalid fills and checks what happens to an invalid event:
// on_invalid, and with park its topic and what an unkeyed event does.
func (t *Source) validateInvalid() error {
	switch t.OnInvalid {
	case "":
		t.OnInvalid = OnInvalidFail
	case OnInvalidFail, OnInvalidDeadLetter, OnInvalidPark:
	default:
		return fmt.Errorf("%s: on_invalid %q: use fail, dead-letter or park", t, t.OnInvalid)
	}
	if t.OnInvalid != OnInvalidPark && (t.ParkedTopic != "" || t.OnInvalidUnkeyed != "") {
		return fmt.Errorf("%s: parked_topic and on_invalid_unkeyed apply to on_invalid: park; set it, or remove them", t)
	}
	if t.OnInvalid != OnInvalidPark {
		return nil
	}
	if t.ParkedTopic == "" {
		t.ParkedTopic = DefaultParkedTopic
	}
	switch t.OnInvalidUnkeyed {
	case "":
		t.OnInvalidUnkeyed = OnInvalidFail
	case OnInvalidFail, OnInvalidDeadLetter:
	default:
		return fmt.Errorf("%s: on_invalid_unkeyed %q: use fail or dead-letter (an event without a key cannot be parked)", t, t.OnInvalidUnkeyed)
	}
	return nil
}

// BackfillOptions selects the rows of a table to send that were committed before
// the slot existed: a poller's pending rows.
type BackfillOptions struct {
	// Where is an SQL condition on the table's columns; "" takes every row.
	Where string
	// OrderBy lists the columns (catalog form, ascending) that give the
	// events' order, such as a sequence or a creation time; empty: the
	// primary key. The primary key's columns are added to make it unique.
	OrderBy []string
	// ChunkSize is how many rows one query reads; DefaultChunkSize.
	ChunkSize int
}

// DefaultMaxTopics is Source.MaxTopics' default: room for the aggregate
// types of a large domain, and a bound on what rows can create.
const DefaultMaxTopics = 100

// Retention is tables[].retention: what the connector deletes of the rows
// it has published (docs/operations.md, "Retention").
type Retention struct {
	// After is how old a row must be, counted from its commit, before it
	// may go. Required, at least 1s.
	After time.Duration
	// BatchSize is how many rows one DELETE removes, each in a short
	// transaction of its own. Default DefaultRetentionBatch.
	BatchSize int
	// Mode is RetentionDelete (the default) or RetentionDropPartitions.
	Mode string
}

// The retention modes.
const (
	RetentionDelete         = "delete"
	RetentionDropPartitions = "drop_partitions"
)

// DefaultRetentionBatch is Retention.BatchSize's default.
const DefaultRetentionBatch = 5000

func (r *Retention) validate(t *Source) error {
	if t.IsMessage() {
		return fmt.Errorf("%s: retention applies to tables, not logical decoding messages", t)
	}
	if r.After < time.Second {
		return fmt.Errorf("%s: retention.after %s: set how old a row must be before it is deleted, at least 1s (hours in production)", t, r.After)
	}
	if r.BatchSize == 0 {
		r.BatchSize = DefaultRetentionBatch
	}
	if r.BatchSize < 1 || r.BatchSize > 100000 {
		return fmt.Errorf("%s: retention.batch_size %d: use 1 to 100000", t, r.BatchSize)
	}
	switch r.Mode {
	case "":
		r.Mode = RetentionDelete
	case RetentionDelete, RetentionDropPartitions:
	default:
		return fmt.Errorf("%s: retention.mode %q: use delete or drop_partitions", t, r.Mode)
	}
	return nil
}

// DefaultChunkSize is Backfill.ChunkSize's default.
const DefaultChunkSize = 1000

// IsMessage reports whether the source is logical decoding messages.
func (t *Source) IsMessage() bool { return t.MessagePrefix != "" }

// String names the source in messages: the table, or message prefix "p".
func (t *Source) String() string {
	if t.IsMessage() {
		return fmt.Sprintf("message prefix %q", t.MessagePrefix)
	}
	return t.Name.String()
}

// ExtraIndex returns column's index in Extra (and so in Event.Extra), or -1.
func (t *Source) ExtraIndex(column string) int {
	for i, c := range t.Extra {
		if c == column {
			return i
		}
	}
	return -1
}

func (t *Source) addExtra(column string) int {
	if i := t.ExtraIndex(column); i >= 0 {
		return i
	}
	t.Extra = append(t.Extra, column)
	return len(t.Extra) - 1
}

// Needed lists every column the decoder must find: mapped fields and
// extras.
func (t *Source) Needed() []string {
	return append(t.Columns.Names(), t.Extra...)
}

// Clone returns a copy of t that shares nothing Validate writes.
func (t *Source) Clone() *Source {
	c := *t
	c.Additional = slices.Clone(t.Additional)
	c.Extra = slices.Clone(t.Extra)
	if t.Backfill != nil {
		b := *t.Backfill
		b.OrderBy = slices.Clone(b.OrderBy)
		c.Backfill = &b
	}
	if t.Retention != nil {
		r := *t.Retention
		c.Retention = &r
	}
	return &c
}

// Validate reports a configuration error in t, fills defaults and derives
// Extra and the parsed templates. It is idempotent.
func (t *Source) Validate() error {
	t.Extra = nil
	if t.Name.Name == "" && t.MessagePrefix == "" {
		return fmt.Errorf("outbox source: set a table name or a message prefix")
	}
	if t.Columns[FieldPayload] == "" {
		return fmt.Errorf("%s: the payload field must be mapped", t)
	}
	if t.Topic == "" && t.Expressions.Topic == "" {
		t.Topic = DefaultTopic
	}
	if t.Key == "" && t.Expressions.Key == "" {
		t.Key = DefaultKey
	}
	switch t.Format {
	case "":
		t.Format = FormatPayload
	case FormatPayload, FormatEnvelope, FormatCloudEventsBinary, FormatCloudEventsStructured:
	default:
		return fmt.Errorf("%s: format %q: use payload, envelope, cloudevents-binary or cloudevents-structured", t, t.Format)
	}
	if err := t.validateInvalid(); err != nil {
		return err
	}
	if t.MaxTopics == 0 {
		t.MaxTopics = DefaultMaxTopics
	}
	if t.MaxTopics < 1 || t.MaxTopics > 100000 {
		return fmt.Errorf("%s: max_topics %d: use 1 to 100000", t, t.MaxTopics)
	}
	for _, c := range t.TopicReplaceIllegal {
		if !LegalTopicChar(c) {
			return fmt.Errorf("%s: topic_normalize replacement %q must itself be legal in topic names", t, t.TopicReplaceIllegal)
		}
	}
	if err := t.Schema.validate(t); err != nil {
		return err
	}
	if t.DeadLetterTopic == "" {
		t.DeadLetterTopic = DefaultDeadLetterTopic
	}
	if t.CloudEventsSource == "" {
		if t.IsMessage() {
			t.CloudEventsSource = "/messages/{prefix}"
		} else {
			t.CloudEventsSource = "/{schema}/{table}"
		}
	}
	if err := t.validateAdditional(); err != nil {
		return err
	}
	if r := t.Retention; r != nil {
		if err := r.validate(t); err != nil {
			return err
		}
	}
	if err := t.validateBackfill(); err != nil {
		return err
	}
	var err error
	t.TopicTemplate, t.KeyTemplate = Template{}, Template{}
	if t.Topic != "" {
		if t.TopicTemplate, err = t.parseTemplate(t.Topic); err != nil {
			return fmt.Errorf("%s: topic: %w", t, err)
		}
	}
	if t.Key != "" {
		if t.KeyTemplate, err = t.parseTemplate(t.Key); err != nil {
			return fmt.Errorf("%s: key: %w", t, err)
		}
	}
	if t.SourceTemplate, err = t.parseTemplate(t.CloudEventsSource); err != nil {
		return fmt.Errorf("%s: cloudevents_source: %w", t, err)
	}
	return t.compileExpressions()
}

// validateAdditional checks the additional columns, and reads them.
func (t *Source) validateAdditional() error {
	for i, a := range t.Additional {
		if a.Column == "" {
			return fmt.Errorf("%s: additional[%d]: column is required", t, i)
		}
		if a.Placement != PlaceHeader && a.Placement != PlaceEnvelope {
			return fmt.Errorf("%s: additional[%d] (%s): placement %q: use header or envelope", t, i, a.Column, a.Placement)
		}
		if a.As == "" {
			t.Additional[i].As = a.Column
		}
		t.addExtra(a.Column)
	}
	return nil
}

// validateBackfill fills and checks the backfill options, if any.
func (t *Source) validateBackfill() error {
	b := t.Backfill
	if b == nil {
		return nil
	}
	if t.IsMessage() {
		return fmt.Errorf("%s: backfill applies to tables, not logical decoding messages", t)
	}
	if t.Columns[FieldID] == "" {
		return fmt.Errorf("%s: backfill needs the id field mapped: it tells a backfilled row from the same row arriving live", t)
	}
	if b.ChunkSize == 0 {
		b.ChunkSize = DefaultChunkSize
	}
	if b.ChunkSize < 1 || b.ChunkSize > 100000 {
		return fmt.Errorf("%s: backfill.chunk_size %d: use 1 to 100000", t, b.ChunkSize)
	}
	return nil
}

// LegalTopicChar reports whether Kafka allows c in a topic name:
// [a-zA-Z0-9._-].
func LegalTopicChar(c rune) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
}

// Kind says how a value's bytes read: it comes from the column's type, or
// from the JSON type of a message member.
type Kind uint8

const (
	KindText      Kind = iota // a string
	KindJSON                  // a JSON document (json, jsonb)
	KindNumber                // a JSON-compatible number (int, float, numeric)
	KindBool                  // "true" or "false"
	KindBytes                 // raw bytes (bytea)
	KindTimestamp             // a timestamp in Postgres' ISO output or RFC 3339
)

// Value is one extracted value. B is nil for SQL NULL (or a missing or
// null JSON member) and never aliases the replication buffer.
type Value struct {
	B    []byte
	Kind Kind
}

// Null reports whether the value is NULL.
func (v Value) Null() bool { return v.B == nil }

// Event is one outbox row, or one logical decoding message, with the
// position and time of the transaction that committed it.
//
// The transaction's end LSN is not part of the Event: pgoutput sends it in
// the COMMIT message, after the rows, and events are produced as soon as
// they are decoded. The checkpoint tracker attaches it to the transaction.
type Event struct {
	Source *Source
	Fields [NumFields]Value
	Extra  []Value // Source.Extra's columns, in that order
	// Raw is the whole message content of a logical decoding message, kept
	// for the dead-letter topic.
	Raw []byte

	// CommitLSN is the LSN of the transaction's commit record (pgoutput
	// Begin.FinalLSN). Several events share it; it is not a unique id.
	CommitLSN  pglogrepl.LSN
	CommitTime time.Time
	XID        uint32
}

// ID returns the event id as text, for messages.
func (e *Event) ID() string { return string(e.Fields[FieldID].B) }

// EventError says that one event cannot be delivered as configured. It is a
// poison event: retrying cannot help, so the connector stops on it (or,
// with on_invalid: dead-letter, sends it to the dead-letter topic).
type EventError struct {
	Table     string
	EventID   string
	CommitLSN pglogrepl.LSN
	Reason    string
}

// Error is the event, why it is invalid, and what works when the
// connector stops on it (on_invalid: fail). Fixing the row does not: its
// INSERT is in the WAL, and the connector sends what the WAL holds.
func (e *EventError) Error() string {
	return fmt.Sprintf("%s; the connector stops here and nothing past this transaction is confirmed. An UPDATE of the row changes nothing (its INSERT is in the WAL). "+
		"To go on: send this one event to the dead-letter topic and stream on with cdc skip --lsn %s --id %s (with your --config), then start again; "+
		"or set on_invalid: dead-letter on the table for every such event (and, for a topic name, topic_normalize)",
		e.Brief(), e.CommitLSN, quoteArg(e.EventID))
}

// Brief is the event and why it is invalid, without advice: the reason a
// dead letter carries.
func (e *EventError) Brief() string {
	return fmt.Sprintf("outbox event id=%q from %s (commit lsn %s): %s", e.EventID, e.Table, e.CommitLSN, e.Reason)
}

// quoteArg quotes s for a shell, when it needs it.
func quoteArg(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:/") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// Invalid returns the EventError for ev.
func Invalid(ev *Event, format string, args ...any) *EventError {
	return &EventError{Table: ev.Source.String(), EventID: ev.ID(), CommitLSN: ev.CommitLSN, Reason: fmt.Sprintf(format, args...)}
}
