package route

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/outbox"
)

// The value formats: seed 004's envelope, and CloudEvents 1.0 in the Kafka
// protocol binding's binary and structured modes. FormatPayload needs no
// code: the value is the payload's bytes.

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
func envelope(tr *tableRoute, ev *outbox.Event) ([]byte, error) {
	b := make([]byte, 0, 256+len(ev.Fields[outbox.FieldPayload].B))
	b = append(b, '{')
	first := true
	add := func(name string, v outbox.Value) {
		if !first {
			b = append(b, ',')
		}
		first = false
		b = appendJSONString(b, name)
		b = append(b, ':')
		b = appendJSON(b, v)
	}
	if ev.Source.Columns[outbox.FieldID] != "" {
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
		if ev.Source.Columns[f.field] != "" {
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
func ceAttributes(ev *outbox.Event) (id, source, typ, subject, tm string, err error) {
	if ev.Fields[outbox.FieldID].Null() {
		return "", "", "", "", "", fmt.Errorf("CloudEvents needs an id: map the id field")
	}
	if ev.Fields[outbox.FieldEventType].Null() {
		return "", "", "", "", "", fmt.Errorf("CloudEvents needs a type: the event type is NULL or not mapped")
	}
	if source, err = expand(ev.Source.SourceTemplate, ev); err != nil {
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
func cloudEventsBinary(ev *outbox.Event, rec *kgo.Record) error {
	id, source, typ, subject, tm, err := ceAttributes(ev)
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
func cloudEventsStructured(ev *outbox.Event, rec *kgo.Record) error {
	id, source, typ, subject, tm, err := ceAttributes(ev)
	if err != nil {
		return err
	}
	payload := ev.Fields[outbox.FieldPayload]
	b := []byte(`{"specversion":"1.0","id":`)
	b = appendJSONString(b, id)
	b = append(b, `,"source":`...)
	b = appendJSONString(b, source)
	b = append(b, `,"type":`...)
	b = appendJSONString(b, typ)
	if subject != "" {
		b = append(b, `,"subject":`...)
		b = appendJSONString(b, subject)
	}
	b = append(b, `,"time":`...)
	b = appendJSONString(b, tm)
	b = append(b, `,"datacontenttype":`...)
	b = appendJSONString(b, contentType(payload.Kind))
	switch {
	case payload.Null():
	case payload.Kind == outbox.KindBytes:
		b = append(b, `,"data_base64":`...)
		b = appendJSONString(b, base64.StdEncoding.EncodeToString(payload.B))
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
		return appendJSONString(b, base64.StdEncoding.EncodeToString(v.B))
	case outbox.KindTimestamp:
		if t, ok := ParseTimestamp(string(v.B)); ok {
			return appendJSONString(b, t.UTC().Format(time.RFC3339Nano))
		}
	}
	return appendJSONString(b, string(v.B))
}

// appendJSONString appends s as a JSON string. strconv.AppendQuote is Go
// syntax, not JSON: it writes a control byte as \x01, which no JSON parser
// reads, so an event_type with one made a valid event invalid. Plain
// printable ASCII is appended as it is; anything else goes through
// encoding/json (control characters as \u00XX, invalid UTF-8 as U+FFFD).
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' {
			q, _ := json.Marshal(s)
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
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
