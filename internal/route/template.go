package route

import (
	"fmt"
	"strings"

	"github.com/outboxcdc/cdc/internal/outbox"
)

// partKind is what a part of a template stands for.
type partKind int

const (
	partLiteral partKind = iota
	partField
	partSchema
	partTable
	partPrefix
	partColumn
)

type part struct {
	kind  partKind
	text  string       // partLiteral
	field outbox.Field // partField
	extra int          // partColumn: index in Event.Extra
	name  string       // placeholder, for errors
}

// Template is a compiled topic, key or CloudEvents source template.
type Template struct{ parts []part }

// Compile parses a template for source t. Placeholders are the mapped
// fields ({aggregate_type}, {aggregate_id}, {event_type}, {id}, {tenant},
// {version}), {schema}, {table}, {prefix}, and {column:NAME} for any other
// column (or JSON member), which Compile adds to t.Extra.
func Compile(tmpl string, t *outbox.Table) (Template, error) {
	var tp Template
	rest := tmpl
	for rest != "" {
		i := strings.IndexByte(rest, '{')
		if i < 0 {
			tp.parts = append(tp.parts, part{kind: partLiteral, text: rest})
			break
		}
		if i > 0 {
			tp.parts = append(tp.parts, part{kind: partLiteral, text: rest[:i]})
		}
		j := strings.IndexByte(rest[i:], '}')
		if j < 0 {
			return Template{}, fmt.Errorf("template %q: unclosed {", tmpl)
		}
		name := rest[i+1 : i+j]
		p := part{name: name}
		switch {
		case name == "schema" && !t.IsMessage():
			p.kind = partSchema
		case name == "table" && !t.IsMessage():
			p.kind = partTable
		case name == "prefix" && t.IsMessage():
			p.kind = partPrefix
		case strings.HasPrefix(name, "column:"):
			col, err := outbox.ParseIdent(strings.TrimPrefix(name, "column:"))
			if err != nil {
				return Template{}, fmt.Errorf("template %q: %w", tmpl, err)
			}
			p.kind, p.extra = partColumn, t.AddExtra(col)
		default:
			f, ok := outbox.FieldByName(name)
			if !ok || f == outbox.FieldPayload || f == outbox.FieldTimestamp || f == outbox.FieldTraceparent {
				return Template{}, fmt.Errorf("template %q: unknown placeholder {%s}; use a mapped field ({aggregate_type}, {aggregate_id}, {event_type}, {id}, {tenant}, {version}), {schema}, {table}, {prefix} or {column:NAME}", tmpl, name)
			}
			if t.Columns[f] == "" {
				return Template{}, fmt.Errorf("template %q uses {%s}, but that field is not mapped to a column", tmpl, name)
			}
			p.kind, p.field = partField, f
		}
		tp.parts = append(tp.parts, p)
		rest = rest[i+j+1:]
	}
	if len(tp.parts) == 0 {
		return Template{}, fmt.Errorf("template is empty")
	}
	return tp, nil
}

// Expand fills the template from ev. A NULL value used by the template is
// an error.
func (tp Template) Expand(ev *outbox.Event) (string, error) {
	if len(tp.parts) == 1 && tp.parts[0].kind == partLiteral {
		return tp.parts[0].text, nil
	}
	var b strings.Builder
	for _, p := range tp.parts {
		var v outbox.Value
		switch p.kind {
		case partLiteral:
			b.WriteString(p.text)
			continue
		case partSchema:
			b.WriteString(ev.Table.Name.Schema)
			continue
		case partTable:
			b.WriteString(ev.Table.Name.Name)
			continue
		case partPrefix:
			b.WriteString(ev.Table.MessagePrefix)
			continue
		case partField:
			v = ev.Fields[p.field]
		case partColumn:
			v = ev.Extra[p.extra]
		}
		if v.Null() {
			return "", fmt.Errorf("{%s} is NULL", p.name)
		}
		b.Write(v.B)
	}
	return b.String(), nil
}
