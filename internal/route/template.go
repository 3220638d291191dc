package route

import (
	"fmt"

	"github.com/outboxcdc/cdc/internal/outbox"
)

// expand fills a template (parsed by outbox.Source.Validate) from ev. A NULL
// value used by the template is an error.
func expand(tp outbox.Template, ev *outbox.Event) (string, error) {
	if len(tp.Parts) == 1 && tp.Parts[0].Kind == outbox.PartLiteral {
		return tp.Parts[0].Text, nil
	}
	b, err := appendExpanded(nil, tp, ev)
	return string(b), err
}

// expandBytes is expand for a record key. A template that is a single
// value returns that value's bytes, not a copy: an event's values are its
// own (the decoder copies each row once) and nothing writes to them.
func expandBytes(tp outbox.Template, ev *outbox.Event) ([]byte, error) {
	if len(tp.Parts) == 1 {
		switch p := tp.Parts[0]; p.Kind {
		case outbox.PartField, outbox.PartColumn:
			v := value(p, ev)
			if v.Null() {
				return nil, fmt.Errorf("{%s} is NULL", p.Name)
			}
			return v.B, nil
		}
	}
	return appendExpanded(nil, tp, ev)
}

// appendExpanded appends tp filled from ev to b.
func appendExpanded(b []byte, tp outbox.Template, ev *outbox.Event) ([]byte, error) {
	for _, p := range tp.Parts {
		switch p.Kind {
		case outbox.PartLiteral:
			b = append(b, p.Text...)
		case outbox.PartSchema:
			b = append(b, ev.Source.Name.Schema...)
		case outbox.PartTable:
			b = append(b, ev.Source.Name.Name...)
		case outbox.PartPrefix:
			b = append(b, ev.Source.MessagePrefix...)
		default:
			v := value(p, ev)
			if v.Null() {
				return b, fmt.Errorf("{%s} is NULL", p.Name)
			}
			b = append(b, v.B...)
		}
	}
	return b, nil
}

// value is a field or column placeholder's value in ev.
func value(p outbox.TemplatePart, ev *outbox.Event) outbox.Value {
	if p.Kind == outbox.PartField {
		return ev.Fields[p.Field]
	}
	return ev.Extra[p.Extra]
}
