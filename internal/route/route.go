package route

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"

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
	// HeaderDeadLetterTruncated, on a dead letter that was too large for
	// kafka.dead_letter_max_message_bytes, holds the sizes cut: the
	// value's and the key's and headers' original bytes.
	HeaderDeadLetterTruncated = "dead_letter_truncated"
)

type metaHeader struct {
	name  string
	field outbox.Field // -1: the commit LSN
}

type placed struct {
	extra int
	name  string
}

// tableRoute is one source's routing, resolved from its (validated) table.
type tableRoute struct {
	meta          []metaHeader
	headerExtras  []placed
	envelopeExtra []placed
	// topics caches the checked topic of each expansion of the topic
	// template: a stream has few topics, and a new string per event would
	// be an allocation per event. distinct holds the topics the template
	// has yielded, at most the table's MaxTopics.
	topics   map[string]string
	distinct map[string]struct{}
	// objects are what the table's expressions read of an event, filled
	// for each (expr.go).
	objects exprObjects
	// headers is the most headers a record of the table carries: the
	// room newRecord makes.
	headers int
}

// maxCachedTopics bounds a source's topic cache; past it the cache starts
// over, so a template with a unique value per event costs an allocation
// per event, not unbounded memory.
const maxCachedTopics = 4096

// Router turns events into Kafka records. It is not safe for concurrent
// use: the replication loop owns it.
type Router struct {
	routes map[*outbox.Source]*tableRoute
	// The commit LSN header is the same for every event of a transaction:
	// format it once per transaction, not once per event. Records only
	// read the shared bytes.
	lsn     pglogrepl.LSN
	lsnText []byte
	scratch []byte // the topic being expanded
	// vars are the variables of the event whose expressions are being
	// evaluated (expr.go).
	vars vars
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

// New resolves each source's headers. The tables must have been validated
// (outbox.Source.Validate), which parsed their templates; New only reads
// them.
func New(tables []*outbox.Source) (*Router, error) {
	r := &Router{routes: make(map[*outbox.Source]*tableRoute, len(tables))}
	for _, t := range tables {
		tr := &tableRoute{topics: map[string]string{}, distinct: map[string]struct{}{}, objects: newExprObjects(t)}
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
			p := placed{extra: t.ExtraIndex(a.Column), name: a.As}
			if p.extra < 0 {
				return nil, fmt.Errorf("%s: additional column %s is not among the extracted columns; validate the table first", t, a.Column)
			}
			if a.Placement == outbox.PlaceHeader {
				tr.headerExtras = append(tr.headerExtras, p)
			} else {
				tr.envelopeExtra = append(tr.envelopeExtra, p)
			}
		}
		if err := checkHeaderNames(t, tr); err != nil {
			return nil, err
		}
		tr.headers = len(tr.meta) + len(tr.headerExtras)
		if t.Columns[outbox.FieldTraceparent] != "" {
			tr.headers++
		}
		if t.Programs != nil {
			tr.headers += len(t.Programs.Headers)
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
func normalize(topic string, t *outbox.Source) string {
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

// topic expands (or computes) and checks ev's topic. An expression's topic
// is checked and bound as a template's.
func (r *Router) topic(tr *tableRoute, ev *outbox.Event) (string, error) {
	if p := ev.Source.Programs; p != nil && p.Topic != nil {
		s, err := r.exprString(ev, "expressions.topic", p.Topic)
		if err != nil {
			return "", err
		}
		r.scratch = append(r.scratch[:0], s...)
	} else {
		tp := ev.Source.TopicTemplate
		if len(tp.Parts) == 1 && tp.Parts[0].Kind == outbox.PartLiteral && !ev.Source.TopicLowercase && ev.Source.TopicReplaceIllegal == "" {
			return tp.Parts[0].Text, nil // checked by Validate
		}
		var err error
		r.scratch, err = appendExpanded(r.scratch[:0], tp, ev)
		if err != nil {
			return "", outbox.Invalid(ev, "topic template %q: %v", ev.Source.Topic, err)
		}
	}
	if topic, ok := tr.topics[string(r.scratch)]; ok {
		return topic, nil
	}
	topic := normalize(string(r.scratch), ev.Source)
	if err := ValidTopic(topic); err != nil {
		return "", outbox.Invalid(ev, "%v", err)
	}
	if _, ok := tr.distinct[topic]; !ok {
		// A row's fields choose its topic: bound what rows can create
		// (topics, and what the connector keeps per topic).
		if len(tr.distinct) >= ev.Source.MaxTopics {
			return "", outbox.Invalid(ev, "its topic %q would be the table's %d-th distinct topic, past tables[].max_topics (%d); raise it if the domain has that many, or fix the row's routing fields", topic, len(tr.distinct)+1, ev.Source.MaxTopics)
		}
		tr.distinct[topic] = struct{}{}
	}
	if len(tr.topics) >= maxCachedTopics {
		clear(tr.topics)
	}
	tr.topics[string(r.scratch)] = topic
	return topic, nil
}

// headers appends ev's metadata, additional and trace headers to h.
func (r *Router) headers(h []kgo.RecordHeader, tr *tableRoute, ev *outbox.Event) []kgo.RecordHeader {
	for _, m := range tr.meta {
		if m.field < 0 {
			h = append(h, kgo.RecordHeader{Key: m.name, Value: r.commitLSN(ev)})
		} else if v := ev.Fields[m.field]; !v.Null() {
			h = append(h, kgo.RecordHeader{Key: m.name, Value: v.B})
		}
	}
	for _, p := range tr.headerExtras {
		if v := ev.Extra[p.extra]; !v.Null() {
			h = append(h, kgo.RecordHeader{Key: p.name, Value: v.B})
		}
	}
	if v := ev.Fields[outbox.FieldTraceparent]; !v.Null() {
		h = append(h, kgo.RecordHeader{Key: HeaderTraceparent, Value: v.B})
	}
	return h
}

// newRecord allocates a record with room for n headers, in one block for
// up to 8: a record lives until Kafka acknowledges it, max_in_flight of
// them at once, so its block is as large as its table's headers need
// (320 bytes with the four default headers, 480 with room for 8). Past
// 8 the headers grow a slice of their own.
func newRecord(n int) *kgo.Record {
	switch {
	case n <= 2:
		b := new(struct {
			rec     kgo.Record
			headers [2]kgo.RecordHeader
		})
		b.rec.Headers = b.headers[:0]
		return &b.rec
	case n <= 4:
		b := new(struct {
			rec     kgo.Record
			headers [4]kgo.RecordHeader
		})
		b.rec.Headers = b.headers[:0]
		return &b.rec
	default:
		b := new(struct {
			rec     kgo.Record
			headers [8]kgo.RecordHeader
		})
		b.rec.Headers = b.headers[:0]
		return &b.rec
	}
}

// Record builds the Kafka record for ev, or returns an *outbox.EventError
// when ev cannot be delivered as configured, or ErrFiltered when its
// table's filter leaves it out.
func (r *Router) Record(ev *outbox.Event) (*kgo.Record, error) {
	if ev.Source.Programs == nil {
		return r.record(ev)
	}
	if err := r.vars.prepare(r.routes[ev.Source], ev); err != nil {
		return nil, err
	}
	defer r.vars.release()
	if err := r.filter(ev); err != nil {
		return nil, err
	}
	return r.record(ev)
}

// key is ev's record key: its table's key expression's, or its template's.
func (r *Router) key(ev *outbox.Event) ([]byte, error) {
	if p := ev.Source.Programs; p != nil && p.Key != nil {
		s, err := r.exprString(ev, "expressions.key", p.Key)
		if err != nil {
			return nil, err
		}
		return []byte(s), nil
	}
	key, err := expandBytes(ev.Source.KeyTemplate, ev)
	if err != nil {
		return nil, outbox.Invalid(ev, "the record key (template %q) is missing: %v", ev.Source.Key, err)
	}
	return key, nil
}

// record is Record once ev passed its table's filter.
func (r *Router) record(ev *outbox.Event) (*kgo.Record, error) {
	tr := r.routes[ev.Source]
	if ev.Fields[outbox.FieldID].Null() && ev.Source.Columns[outbox.FieldID] != "" {
		return nil, outbox.Invalid(ev, "the event id is NULL")
	}
	topic, err := r.topic(tr, ev)
	if err != nil {
		return nil, err
	}
	key, err := r.key(ev)
	if err != nil {
		return nil, err
	}
	rec := newRecord(tr.headers)
	rec.Topic, rec.Key, rec.Timestamp = topic, key, ev.CommitTime
	rec.Headers = r.headers(rec.Headers, tr, ev)
	if ev.Source.Programs != nil {
		if err := r.exprRecord(ev, rec); err != nil {
			return nil, err
		}
	}

	payload := ev.Fields[outbox.FieldPayload]
	if ev.Source.Tombstone && len(payload.B) == 0 {
		rec.Value = nil // a tombstone for the key, whatever the format
		return rec, nil
	}
	switch ev.Source.Format {
	case outbox.FormatEnvelope:
		rec.Value, err = envelope(tr, ev)
	case outbox.FormatCloudEventsBinary:
		err = cloudEventsBinary(ev, rec)
	case outbox.FormatCloudEventsStructured:
		err = cloudEventsStructured(ev, rec)
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

// Topic is the topic ev's record goes to, or why it has none.
func (r *Router) Topic(ev *outbox.Event) (string, error) { return r.topic(r.routes[ev.Source], ev) }

// Key is ev's record key, or why it has none: its key expression's, or its
// template's.
func (r *Router) Key(ev *outbox.Event) ([]byte, error) { return r.key(ev) }

// DeadLetter builds the dead-letter record for ev: the original bytes (the
// payload as stored, or a message's whole content) under the original key,
// with the headers the record would have had, plus headers that say what
// went wrong where. Whatever made ev invalid, the parts that can still be
// worked out are kept: a NULL key template leaves the key empty, an illegal
// topic leaves out dead_letter_topic.
func (r *Router) DeadLetter(ev *outbox.Event, reason string) *kgo.Record {
	value := ev.Fields[outbox.FieldPayload].B
	if ev.Raw != nil {
		value = ev.Raw
	}
	if value == nil {
		value = []byte{}
	}
	dl := &kgo.Record{Topic: ev.Source.DeadLetterTopic, Value: value, Timestamp: ev.CommitTime}
	if key, err := r.key(ev); err == nil {
		dl.Key = key
	}
	tr := r.routes[ev.Source]
	dl.Headers = r.headers(make([]kgo.RecordHeader, 0, 16), tr, ev)
	dl.Headers = r.deadLetterHeaders(ev, dl.Headers)
	if topic, err := r.topic(tr, ev); err == nil {
		dl.Headers = append(dl.Headers, kgo.RecordHeader{Key: HeaderDeadLetterTopic, Value: []byte(topic)})
	}
	dl.Headers = append(dl.Headers,
		kgo.RecordHeader{Key: HeaderDeadLetterError, Value: []byte(reason)},
		kgo.RecordHeader{Key: HeaderDeadLetterSource, Value: []byte(ev.Source.String())},
		kgo.RecordHeader{Key: HeaderDeadLetterLSN, Value: r.commitLSN(ev)},
		kgo.RecordHeader{Key: HeaderDeadLetterID, Value: []byte(ev.ID())},
	)
	return dl
}

// TruncateDeadLetter makes dead letter dl fit in limit bytes (as size counts
// them): its value is cut first, then its key and the longest header values,
// and a HeaderDeadLetterTruncated header says by how much. The reason, source,
// LSN and id headers are kept whole where they fit: a dead letter is a record
// that something went wrong, and a row that is too large for it must not stop
// the stream instead (docs/design.md, "No path skips a record").
func TruncateDeadLetter(dl *kgo.Record, limit int, size func(*kgo.Record) int) {
	over := size(dl) - limit
	if over <= 0 {
		return
	}
	note := fmt.Sprintf("value %d of %d bytes kept", 0, len(dl.Value))
	over += len(HeaderDeadLetterTruncated) + len(note) + 32 // the note itself, and its digits
	cut := func(b []byte) []byte {
		n := min(over, len(b))
		over -= n
		return b[:len(b)-n]
	}
	orig := len(dl.Value)
	dl.Value = cut(dl.Value)
	keyOrig := len(dl.Key)
	if over > 0 {
		dl.Key = cut(dl.Key)
	}
	keep := map[string]bool{HeaderDeadLetterError: true, HeaderDeadLetterSource: true, HeaderDeadLetterLSN: true}
	for over > 0 {
		longest := -1
		for i, h := range dl.Headers {
			if !keep[h.Key] && len(h.Value) > 0 && (longest < 0 || len(h.Value) > len(dl.Headers[longest].Value)) {
				longest = i
			}
		}
		if longest < 0 {
			break // only the kept headers are left: size what they are
		}
		dl.Headers[longest].Value = cut(dl.Headers[longest].Value)
	}
	note = fmt.Sprintf("value %d of %d bytes kept", len(dl.Value), orig)
	if len(dl.Key) < keyOrig {
		note += fmt.Sprintf(", key %d of %d", len(dl.Key), keyOrig)
	}
	dl.Headers = append(dl.Headers, kgo.RecordHeader{Key: HeaderDeadLetterTruncated, Value: []byte(note)})
}
