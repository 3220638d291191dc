package route

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/outbox"
)

// Metadata header keys, and their default names. docs/config.md lists them;
// tables[].headers renames them or turns them off.
const (
	HeaderID            = "id" // Debezium EventRouter's default
	HeaderEventType     = "event_type"
	HeaderAggregateType = "aggregate_type"
	HeaderAggregateID   = "aggregate_id"
	HeaderTenant        = "tenant"
	HeaderVersion       = "version"
	HeaderCommitLSN     = "commit_lsn"
	HeaderTraceparent   = "traceparent" // W3C Trace Context; fixed name
)

// defaultHeaders maps each metadata header key to its default name; ""
// means off unless configured.
var defaultHeaders = []struct {
	key   string
	field outbox.Field // -1: not a field
	name  string
}{
	{HeaderID, outbox.FieldID, HeaderID},
	{HeaderEventType, outbox.FieldEventType, HeaderEventType},
	{HeaderAggregateType, outbox.FieldAggregateType, HeaderAggregateType},
	{HeaderAggregateID, outbox.FieldAggregateID, ""},
	{HeaderTenant, outbox.FieldTenant, HeaderTenant},
	{HeaderVersion, outbox.FieldVersion, HeaderVersion},
	{HeaderCommitLSN, -1, HeaderCommitLSN},
}

// Dead-letter headers, added to the original record's headers.
const (
	HeaderDeadLetterError  = "dead_letter_error"
	HeaderDeadLetterSource = "dead_letter_source"
	HeaderDeadLetterLSN    = "dead_letter_commit_lsn"
	HeaderDeadLetterID     = "dead_letter_event_id"
	HeaderDeadLetterTopic  = "dead_letter_topic"
)

type metaHeader struct {
	name  string
	field outbox.Field
}

type placed struct {
	extra int
	name  string
}

// tableRoute is one source's compiled routing.
type tableRoute struct {
	t             *outbox.Table
	topic, key    Template
	ceSource      Template
	meta          []metaHeader
	headerExtras  []placed
	envelopeExtra []placed
}

// Router turns events into Kafka records. It is not safe for concurrent
// use: the replication loop owns it.
type Router struct {
	routes map[*outbox.Table]*tableRoute
	// The commit LSN header is the same for every event of a transaction:
	// format it once per transaction, not once per event. Records only
	// read the shared bytes.
	lsn     pglogrepl.LSN
	lsnText []byte
}

// commitLSN returns ev's commit LSN as header bytes, e.g. "0/16B3748".
func (r *Router) commitLSN(ev *outbox.Event) []byte {
	if r.lsnText == nil || ev.CommitLSN != r.lsn {
		b := make([]byte, 0, 17)
		b = strconv.AppendUint(b, uint64(ev.CommitLSN)>>32, 16)
		b = append(b, '/')
		b = strconv.AppendUint(b, uint64(ev.CommitLSN)&0xFFFFFFFF, 16)
		r.lsn, r.lsnText = ev.CommitLSN, bytes.ToUpper(b)
	}
	return r.lsnText
}

// New compiles every source's templates. It adds the columns that
// {column:NAME} placeholders and additional placements need to each
// source's Extra, so call it before decoding or checking tables.
func New(tables []*outbox.Table) (*Router, error) {
	r := &Router{routes: make(map[*outbox.Table]*tableRoute, len(tables))}
	for _, t := range tables {
		tr := &tableRoute{t: t}
		var err error
		if tr.topic, err = Compile(t.Topic, t); err != nil {
			return nil, fmt.Errorf("%s: topic: %w", t, err)
		}
		if tr.key, err = Compile(t.Key, t); err != nil {
			return nil, fmt.Errorf("%s: key: %w", t, err)
		}
		if tr.ceSource, err = Compile(t.CloudEventsSource, t); err != nil {
			return nil, fmt.Errorf("%s: cloudevents_source: %w", t, err)
		}
		for k := range t.Headers {
			known := false
			for _, h := range defaultHeaders {
				known = known || h.key == k
			}
			if !known {
				return nil, fmt.Errorf("%s: headers: unknown header %q; use id, event_type, aggregate_type, aggregate_id, tenant, version or commit_lsn", t, k)
			}
		}
		for _, h := range defaultHeaders {
			name := h.name
			if n, ok := t.Headers[h.key]; ok {
				name = n
			}
			if name == "" || (h.field >= 0 && t.Columns[h.field] == "") {
				continue
			}
			tr.meta = append(tr.meta, metaHeader{name: name, field: h.field})
		}
		for _, a := range t.Additional {
			p := placed{extra: t.AddExtra(a.Column), name: a.As}
			if a.Placement == outbox.PlaceHeader {
				tr.headerExtras = append(tr.headerExtras, p)
			} else {
				tr.envelopeExtra = append(tr.envelopeExtra, p)
			}
		}
		r.routes[t] = tr
	}
	return r, nil
}

// ValidTopic reports why name is not a legal Kafka topic name, or nil.
// Kafka allows 1 to 249 characters of [a-zA-Z0-9._-], except "." and "..".
func ValidTopic(name string) error {
	if name == "" || name == "." || name == ".." {
		return fmt.Errorf("%q is not a legal Kafka topic name", name)
	}
	if len(name) > 249 {
		return fmt.Errorf("topic name %.40q... is %d characters; Kafka allows 249", name, len(name))
	}
	for _, c := range name {
		if !outbox.LegalTopicChar(c) {
			return fmt.Errorf("topic name %q contains %q; Kafka allows only letters, digits, '.', '_' and '-'", name, c)
		}
	}
	return nil
}

// normalize applies the normalisations the source turned on, and only
// those.
func normalize(topic string, t *outbox.Table) string {
	if t.TopicLowercase {
		topic = strings.ToLower(topic)
	}
	if t.TopicReplaceIllegal != "" {
		var b strings.Builder
		for _, c := range topic {
			if outbox.LegalTopicChar(c) {
				b.WriteRune(c)
			} else {
				b.WriteString(t.TopicReplaceIllegal)
			}
		}
		topic = b.String()
	}
	return topic
}

// Record builds the Kafka record for ev, or returns an *outbox.EventError
// when ev cannot be delivered as configured.
func (r *Router) Record(ev *outbox.Event) (*kgo.Record, error) {
	tr := r.routes[ev.Table]
	if ev.Fields[outbox.FieldID].Null() && ev.Table.Columns[outbox.FieldID] != "" {
		return nil, outbox.Invalid(ev, "the event id is NULL")
	}
	topic, err := tr.topic.Expand(ev)
	if err != nil {
		return nil, outbox.Invalid(ev, "topic template %q: %v", ev.Table.Topic, err)
	}
	topic = normalize(topic, ev.Table)
	if err := ValidTopic(topic); err != nil {
		return nil, outbox.Invalid(ev, "%v", err)
	}
	key, err := tr.key.Expand(ev)
	if err != nil {
		return nil, outbox.Invalid(ev, "the record key (template %q) is missing: %v", ev.Table.Key, err)
	}
	rec := &kgo.Record{Topic: topic, Key: []byte(key), Timestamp: ev.CommitTime}
	rec.Headers = make([]kgo.RecordHeader, 0, len(tr.meta)+len(tr.headerExtras)+8)
	for _, h := range tr.meta {
		if h.field < 0 {
			rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: h.name, Value: r.commitLSN(ev)})
		} else if v := ev.Fields[h.field]; !v.Null() {
			rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: h.name, Value: v.B})
		}
	}
	for _, p := range tr.headerExtras {
		if v := ev.Extra[p.extra]; !v.Null() {
			rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: p.name, Value: v.B})
		}
	}
	if v := ev.Fields[outbox.FieldTraceparent]; !v.Null() {
		rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: HeaderTraceparent, Value: v.B})
	}

	payload := ev.Fields[outbox.FieldPayload]
	if ev.Table.Tombstone && len(payload.B) == 0 {
		rec.Value = nil // a tombstone for the key, whatever the format
		return rec, nil
	}
	switch ev.Table.Format {
	case outbox.FormatEnvelope:
		rec.Value, err = tr.envelope(ev)
	case outbox.FormatCloudEventsBinary:
		err = tr.cloudEventsBinary(ev, rec)
	case outbox.FormatCloudEventsStructured:
		err = tr.cloudEventsStructured(ev, rec)
	default:
		rec.Value = payload.B
		if rec.Value == nil {
			// NULL is sent as an empty value, not a null one: Kafka treats
			// a null value as a tombstone (see tombstone_on_empty_payload).
			rec.Value = []byte{}
		}
	}
	if err != nil {
		return nil, outbox.Invalid(ev, "%v", err)
	}
	return rec, nil
}

// occurredAt is the event's timestamp field, or the commit time.
func occurredAt(ev *outbox.Event) time.Time {
	if v := ev.Fields[outbox.FieldTimestamp]; !v.Null() {
		if t, ok := ParseTimestamp(string(v.B)); ok {
			return t
		}
	}
	return ev.CommitTime
}

// envelope is seed 004's shape: metadata and the payload embedded as JSON.
func (tr *tableRoute) envelope(ev *outbox.Event) ([]byte, error) {
	b := make([]byte, 0, 256+len(ev.Fields[outbox.FieldPayload].B))
	b = append(b, '{')
	first := true
	add := func(name string, v outbox.Value) {
		if !first {
			b = append(b, ',')
		}
		first = false
		b = strconv.AppendQuote(b, name)
		b = append(b, ':')
		b = appendJSON(b, v)
	}
	if ev.Table.Columns[outbox.FieldID] != "" {
		add("event_id", ev.Fields[outbox.FieldID])
	}
	add("occurred_at", outbox.Value{B: []byte(occurredAt(ev).UTC().Format(time.RFC3339Nano)), Kind: outbox.KindText})
	for _, f := range []struct {
		name  string
		field outbox.Field
	}{
		{"aggregate_type", outbox.FieldAggregateType}, {"aggregate_id", outbox.FieldAggregateID},
		{"event_type", outbox.FieldEventType}, {"version", outbox.FieldVersion}, {"tenant", outbox.FieldTenant},
	} {
		if ev.Table.Columns[f.field] != "" {
			add(f.name, ev.Fields[f.field])
		}
	}
	for _, p := range tr.envelopeExtra {
		add(p.name, ev.Extra[p.extra])
	}
	add("payload", ev.Fields[outbox.FieldPayload])
	b = append(b, '}')
	if !json.Valid(b) {
		return nil, fmt.Errorf("the payload is declared JSON but is not valid JSON")
	}
	return b, nil
}

// ceAttributes are the CloudEvents attributes from the mapping.
func (tr *tableRoute) ceAttributes(ev *outbox.Event) (id, source, typ, subject, tm string, err error) {
	if ev.Fields[outbox.FieldID].Null() {
		return "", "", "", "", "", fmt.Errorf("CloudEvents needs an id: map the id field")
	}
	if ev.Fields[outbox.FieldEventType].Null() {
		return "", "", "", "", "", fmt.Errorf("CloudEvents needs a type: the event type is NULL or not mapped")
	}
	if source, err = tr.ceSource.Expand(ev); err != nil {
		return "", "", "", "", "", fmt.Errorf("cloudevents_source: %v", err)
	}
	if v := ev.Fields[outbox.FieldAggregateID]; !v.Null() {
		subject = string(v.B)
	}
	return ev.ID(), source, string(ev.Fields[outbox.FieldEventType].B), subject, occurredAt(ev).UTC().Format(time.RFC3339Nano), nil
}

func contentType(k outbox.Kind) string {
	switch k {
	case outbox.KindJSON:
		return "application/json"
	case outbox.KindBytes:
		return "application/octet-stream"
	default:
		return "text/plain; charset=utf-8"
	}
}

// cloudEventsBinary follows the CloudEvents Kafka protocol binding, binary
// mode: attributes in ce_ headers, the payload as the value.
func (tr *tableRoute) cloudEventsBinary(ev *outbox.Event, rec *kgo.Record) error {
	id, source, typ, subject, tm, err := tr.ceAttributes(ev)
	if err != nil {
		return err
	}
	payload := ev.Fields[outbox.FieldPayload]
	h := []kgo.RecordHeader{
		{Key: "ce_specversion", Value: []byte("1.0")},
		{Key: "ce_id", Value: []byte(id)},
		{Key: "ce_source", Value: []byte(source)},
		{Key: "ce_type", Value: []byte(typ)},
		{Key: "ce_time", Value: []byte(tm)},
	}
	if subject != "" {
		h = append(h, kgo.RecordHeader{Key: "ce_subject", Value: []byte(subject)})
	}
	h = append(h, kgo.RecordHeader{Key: "content-type", Value: []byte(contentType(payload.Kind))})
	rec.Headers = append(h, rec.Headers...)
	rec.Value = payload.B
	if rec.Value == nil {
		rec.Value = []byte{}
	}
	return nil
}

// cloudEventsStructured follows the Kafka protocol binding, structured
// mode: the whole event as application/cloudevents+json.
func (tr *tableRoute) cloudEventsStructured(ev *outbox.Event, rec *kgo.Record) error {
	id, source, typ, subject, tm, err := tr.ceAttributes(ev)
	if err != nil {
		return err
	}
	payload := ev.Fields[outbox.FieldPayload]
	b := []byte(`{"specversion":"1.0","id":`)
	b = strconv.AppendQuote(b, id)
	b = append(b, `,"source":`...)
	b = strconv.AppendQuote(b, source)
	b = append(b, `,"type":`...)
	b = strconv.AppendQuote(b, typ)
	if subject != "" {
		b = append(b, `,"subject":`...)
		b = strconv.AppendQuote(b, subject)
	}
	b = append(b, `,"time":`...)
	b = strconv.AppendQuote(b, tm)
	b = append(b, `,"datacontenttype":`...)
	b = strconv.AppendQuote(b, contentType(payload.Kind))
	switch {
	case payload.Null():
	case payload.Kind == outbox.KindBytes:
		b = append(b, `,"data_base64":`...)
		b = strconv.AppendQuote(b, base64.StdEncoding.EncodeToString(payload.B))
	default:
		b = append(b, `,"data":`...)
		b = appendJSON(b, payload)
	}
	b = append(b, '}')
	if !json.Valid(b) {
		return fmt.Errorf("the payload is declared JSON but is not valid JSON")
	}
	rec.Headers = append([]kgo.RecordHeader{{Key: "content-type", Value: []byte("application/cloudevents+json; charset=UTF-8")}}, rec.Headers...)
	rec.Value = b
	return nil
}

// appendJSON writes v as a JSON value by its kind: JSON stays a document
// (never a string holding JSON), numbers and booleans stay literals, bytes
// become base64, timestamps RFC 3339, the rest strings.
func appendJSON(b []byte, v outbox.Value) []byte {
	if v.Null() {
		return append(b, "null"...)
	}
	switch v.Kind {
	case outbox.KindJSON:
		return append(b, v.B...)
	case outbox.KindNumber:
		if json.Valid(v.B) { // numeric's NaN and Infinity are not JSON
			return append(b, v.B...)
		}
	case outbox.KindBool:
		switch string(v.B) {
		case "t", "true":
			return append(b, "true"...)
		case "f", "false":
			return append(b, "false"...)
		}
	case outbox.KindBytes:
		return strconv.AppendQuote(b, base64.StdEncoding.EncodeToString(v.B))
	case outbox.KindTimestamp:
		if t, ok := ParseTimestamp(string(v.B)); ok {
			return strconv.AppendQuote(b, t.UTC().Format(time.RFC3339Nano))
		}
	}
	s, _ := json.Marshal(string(v.B)) // valid UTF-8 escaping, unlike AppendQuote
	return append(b, s...)
}

// ParseTimestamp reads Postgres' ISO timestamp output ("2026-11-22
// 10:00:00.123+00", without zone meaning UTC) or RFC 3339.
func ParseTimestamp(s string) (time.Time, bool) {
	for _, layout := range []string{
		"2006-01-02 15:04:05.999999999Z07:00", "2006-01-02 15:04:05.999999999Z07",
		"2006-01-02 15:04:05.999999999", time.RFC3339Nano,
	} {
		if t, err := time.Parse(layout, s); err == nil {
			return t, true
		}
	}
	return time.Time{}, false
}

// DeadLetter builds the dead-letter record for ev: the original bytes (the
// payload as stored, or a message's whole content) with the original
// headers when rec exists, plus headers that say what went wrong where.
func (r *Router) DeadLetter(ev *outbox.Event, rec *kgo.Record, reason string) *kgo.Record {
	value := ev.Fields[outbox.FieldPayload].B
	if ev.Raw != nil {
		value = ev.Raw
	}
	if value == nil {
		value = []byte{}
	}
	dl := &kgo.Record{Topic: ev.Table.DeadLetterTopic, Value: value, Timestamp: ev.CommitTime}
	if rec != nil {
		dl.Key = rec.Key
		dl.Headers = append(dl.Headers, rec.Headers...)
		dl.Headers = append(dl.Headers, kgo.RecordHeader{Key: HeaderDeadLetterTopic, Value: []byte(rec.Topic)})
	} else if key, err := r.routes[ev.Table].key.Expand(ev); err == nil {
		dl.Key = []byte(key)
	}
	dl.Headers = append(dl.Headers,
		kgo.RecordHeader{Key: HeaderDeadLetterError, Value: []byte(reason)},
		kgo.RecordHeader{Key: HeaderDeadLetterSource, Value: []byte(ev.Table.String())},
		kgo.RecordHeader{Key: HeaderDeadLetterLSN, Value: r.commitLSN(ev)},
		kgo.RecordHeader{Key: HeaderDeadLetterID, Value: []byte(ev.ID())},
	)
	return dl
}
