package outbox

import (
	"fmt"
	"strings"

	"github.com/outboxcdc/cdc/internal/pgident"
)

// PartKind is what a part of a template stands for.
type PartKind uint8

const (
	PartLiteral PartKind = iota // Text as it is
	PartField                   // a mapped field's value
	PartSchema                  // the table's schema
	PartTable                   // the table's name
	PartPrefix                  // the message prefix
	PartColumn                  // another column's value, from Event.Extra
)

// TemplatePart is one literal or placeholder of a template.
type TemplatePart struct {
	Kind  PartKind
	Text  string // PartLiteral
	Field Field  // PartField
	Extra int    // PartColumn: index in Event.Extra
	Name  string // the placeholder as written, for errors
}

// Template is a parsed topic, key or CloudEvents source template. route
// expands it for each event.
type Template struct{ Parts []TemplatePart }

// parseTemplate parses a template of t. Placeholders are the mapped fields
// ({aggregate_type}, {aggregate_id}, {event_type}, {id}, {tenant},
// {version}), {schema}, {table}, {prefix}, and {column:NAME} for any other
// column (or JSON member), which it adds to t.Extra.
func (t *Source) parseTemplate(tmpl string) (Template, error) {
	var tp Template
	rest := tmpl
	for rest != "" {
		i := strings.IndexByte(rest, '{')
		if i < 0 {
			tp.Parts = append(tp.Parts, TemplatePart{Kind: PartLiteral, Text: rest})
			break
		}
		if i > 0 {
			tp.Parts = append(tp.Parts, TemplatePart{Kind: PartLiteral, Text: rest[:i]})
		}
		j := strings.IndexByte(rest[i:], '}')
		if j < 0 {
			return Template{}, fmt.Errorf("template %q: unclosed {", tmpl)
		}
		name := rest[i+1 : i+j]
		p := TemplatePart{Name: name}
		switch {
		case name == "schema" && !t.IsMessage():
			p.Kind = PartSchema
		case name == "table" && !t.IsMessage():
			p.Kind = PartTable
		case name == "prefix" && t.IsMessage():
			p.Kind = PartPrefix
		case strings.HasPrefix(name, "column:"):
			col, err := pgident.Parse(strings.TrimPrefix(name, "column:"))
			if err != nil {
				return Template{}, fmt.Errorf("template %q: %w", tmpl, err)
			}
			p.Kind, p.Extra = PartColumn, t.addExtra(col)
		default:
			f, ok := FieldByName(name)
			if !ok || f == FieldPayload || f == FieldTimestamp || f == FieldTraceparent {
				return Template{}, fmt.Errorf("template %q: unknown placeholder {%s}; use a mapped field ({aggregate_type}, {aggregate_id}, {event_type}, {id}, {tenant}, {version}), {schema}, {table}, {prefix} or {column:NAME}", tmpl, name)
			}
			if t.Columns[f] == "" {
				return Template{}, fmt.Errorf("template %q uses {%s}, but that field is not mapped to a column", tmpl, name)
			}
			p.Kind, p.Field = PartField, f
		}
		tp.Parts = append(tp.Parts, p)
		rest = rest[i+j+1:]
	}
	if len(tp.Parts) == 0 {
		return Template{}, fmt.Errorf("template is empty")
	}
	return tp, nil
}

// LiteralTopic is the table's topic when its template has no
// placeholders, lowercased as the table asks; "" when a row's fields
// (or an expression) choose it.
func (t *Source) LiteralTopic() string {
	var b strings.Builder
	for _, part := range t.TopicTemplate.Parts {
		if part.Kind != PartLiteral {
			return ""
		}
		b.WriteString(part.Text)
	}
	if t.TopicLowercase {
		return strings.ToLower(b.String())
	}
	return b.String()
}

// TopicFromRow reports whether a row's fields fill part of the topic: its
// template has a field or {column:...} placeholder, or an expression
// computes it.
func (t *Source) TopicFromRow() bool {
	if t.Expressions.Topic != "" {
		return true
	}
	for _, p := range t.TopicTemplate.Parts {
		if p.Kind == PartField || p.Kind == PartColumn {
			return true
		}
	}
	return false
}

// FixedTopics are the topics the table's events go to whatever the row:
// its literal topic, and its dead-letter topic when on_invalid sends there
// and the name has no placeholder.
func (t *Source) FixedTopics() []string {
	var topics []string
	if topic := t.LiteralTopic(); topic != "" {
		topics = append(topics, topic)
	}
	if (t.OnInvalid == OnInvalidDeadLetter || t.OnInvalidUnkeyed == OnInvalidDeadLetter) && t.DeadLetterTopic != "" && !strings.Contains(t.DeadLetterTopic, "{") {
		topics = append(topics, t.DeadLetterTopic)
	}
	if t.OnInvalid == OnInvalidPark {
		topics = append(topics, t.ParkedTopic)
	}
	return topics
}
