package route

import (
	"fmt"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/outbox"
)

// Header names set on every record. They are part of the public contract;
// docs/config.md lists them.
const (
	HeaderID            = "id" // Debezium EventRouter's default
	HeaderEventType     = "event_type"
	HeaderAggregateType = "aggregate_type"
	HeaderCommitLSN     = "commit_lsn"
)

// field is a placeholder of a topic template.
type field int

const (
	literal field = iota
	fieldAggregateType
	fieldEventType
	fieldSchema
	fieldTable
)

var placeholders = map[string]field{
	"aggregate_type": fieldAggregateType,
	"event_type":     fieldEventType,
	"schema":         fieldSchema,
	"table":          fieldTable,
}

type part struct {
	field field
	text  string
}

// Template is a compiled topic template.
type Template struct{ parts []part }

// Compile parses a topic template. Placeholders are {aggregate_type},
// {event_type}, {schema} and {table}; everything else is literal text.
func Compile(tmpl string) (Template, error) {
	var t Template
	rest := tmpl
	for rest != "" {
		i := strings.IndexByte(rest, '{')
		if i < 0 {
			t.parts = append(t.parts, part{text: rest})
			break
		}
		if i > 0 {
			t.parts = append(t.parts, part{text: rest[:i]})
		}
		j := strings.IndexByte(rest[i:], '}')
		if j < 0 {
			return Template{}, fmt.Errorf("topic template %q: unclosed {", tmpl)
		}
		name := rest[i+1 : i+j]
		f, ok := placeholders[name]
		if !ok {
			return Template{}, fmt.Errorf("topic template %q: unknown placeholder {%s}; use {aggregate_type}, {event_type}, {schema} or {table}", tmpl, name)
		}
		t.parts = append(t.parts, part{field: f})
		rest = rest[i+j+1:]
	}
	if len(t.parts) == 0 {
		return Template{}, fmt.Errorf("topic template is empty")
	}
	return t, nil
}

// Expand fills the template from ev. A NULL field used by the template is
// an error.
func (t Template) Expand(ev *outbox.Event) (string, error) {
	if len(t.parts) == 1 && t.parts[0].field == literal {
		return t.parts[0].text, nil
	}
	var b strings.Builder
	for _, p := range t.parts {
		switch p.field {
		case literal:
			b.WriteString(p.text)
		case fieldAggregateType:
			if ev.AggregateType == nil {
				return "", fmt.Errorf("the topic template uses the aggregate type, which is NULL")
			}
			b.Write(ev.AggregateType)
		case fieldEventType:
			if ev.Type == nil {
				return "", fmt.Errorf("the topic template uses the event type, which is NULL")
			}
			b.Write(ev.Type)
		case fieldSchema:
			b.WriteString(ev.Table.Name.Schema)
		case fieldTable:
			b.WriteString(ev.Table.Name.Name)
		}
	}
	return b.String(), nil
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
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("topic name %q contains %q; Kafka allows only letters, digits, '.', '_' and '-'", name, c)
		}
	}
	return nil
}

// Router turns events into Kafka records using each table's compiled topic
// template.
type Router struct {
	topics map[*outbox.Table]Template
}

// New compiles the topic template of every table.
func New(tables []*outbox.Table) (*Router, error) {
	r := &Router{topics: make(map[*outbox.Table]Template, len(tables))}
	for _, t := range tables {
		tmpl, err := Compile(t.Topic)
		if err != nil {
			return nil, fmt.Errorf("table %s: %w", t.Name, err)
		}
		r.topics[t] = tmpl
	}
	return r, nil
}

// Record builds the Kafka record for ev, or returns an *outbox.EventError
// when ev cannot be delivered as configured.
func (r *Router) Record(ev *outbox.Event) (*kgo.Record, error) {
	poison := func(reason string) error {
		return &outbox.EventError{Table: ev.Table.Name, EventID: string(ev.ID), CommitLSN: ev.CommitLSN, Reason: reason}
	}
	if ev.ID == nil {
		return nil, poison(fmt.Sprintf("the event id column %s is NULL", outbox.QuoteIdent(ev.Table.Columns.ID)))
	}
	if ev.AggregateID == nil {
		return nil, poison(fmt.Sprintf("the aggregate id column %s is NULL, and it is the record key", outbox.QuoteIdent(ev.Table.Columns.AggregateID)))
	}
	topic, err := r.topics[ev.Table].Expand(ev)
	if err != nil {
		return nil, poison(err.Error())
	}
	if err := ValidTopic(topic); err != nil {
		return nil, poison(err.Error())
	}
	value := ev.Payload
	if value == nil {
		// A NULL payload is sent as an empty value, not as a null value:
		// Kafka treats a null value as a tombstone on compacted topics.
		value = []byte{}
	}
	headers := make([]kgo.RecordHeader, 0, 4)
	headers = append(headers, kgo.RecordHeader{Key: HeaderID, Value: ev.ID})
	if ev.Type != nil {
		headers = append(headers, kgo.RecordHeader{Key: HeaderEventType, Value: ev.Type})
	}
	if ev.AggregateType != nil {
		headers = append(headers, kgo.RecordHeader{Key: HeaderAggregateType, Value: ev.AggregateType})
	}
	headers = append(headers, kgo.RecordHeader{Key: HeaderCommitLSN, Value: []byte(ev.CommitLSN.String())})
	return &kgo.Record{
		Topic:     topic,
		Key:       ev.AggregateID,
		Value:     value,
		Headers:   headers,
		Timestamp: ev.CommitTime,
	}, nil
}
