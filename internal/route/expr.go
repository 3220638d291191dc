package route

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/expr"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/sink"
)

// ErrFiltered is Record's answer for an event its table's filter left out:
// not an error of the event, and not a record. A caller that does not
// know it stops on it, rather than drop the event unknowingly.
var ErrFiltered = errors.New("the table's filter leaves this event out")

// vars is one event's variables for its table's expressions
// (expr.Activation). The Router has one, prepared at the start of each
// call that evaluates an event's expressions and released at its end, so
// that payload is parsed once per event, however many expressions read
// it, and nothing of one event is read for another.
type vars struct {
	ev      *outbox.Event
	payload any
	row     map[string]any // reused: an expression's result never holds it
}

// prepare reads what ev's table's expressions read of it: the payload
// parsed, the row's columns typed. A payload that is not JSON is the
// event's problem.
func (v *vars) prepare(ev *outbox.Event) error {
	p := ev.Source.Programs
	v.ev, v.payload = ev, nil
	if p.Payload {
		var err error
		if v.payload, err = parseJSON(ev.Fields[outbox.FieldPayload].B); err != nil {
			v.ev = nil
			return outbox.Invalid(ev, "its payload is not JSON, and the table's expressions read payload: %v", err)
		}
	}
	if len(p.Row) > 0 {
		if v.row == nil {
			v.row = make(map[string]any, len(p.Row))
		}
		clear(v.row)
		for _, c := range p.Row {
			v.row[c.Name] = typed(ev.Extra[c.Extra])
		}
	}
	return nil
}

func (v *vars) release() { v.ev, v.payload = nil, nil }

// ResolveName is a variable's value: docs/config.md, "Expressions", says
// each one's type.
func (v *vars) ResolveName(name string) (any, bool) {
	switch name {
	case expr.Row:
		return v.row, true
	case expr.Payload:
		return v.payload, true
	case expr.CommitLSN:
		return v.ev.CommitLSN.String(), true
	case expr.CommitTime:
		return v.ev.CommitTime, true
	}
	if f, ok := outbox.FieldByName(name); ok {
		return typed(v.ev.Fields[f]), true
	}
	return nil, false
}

func (v *vars) Parent() expr.Activation { return nil }

// typed is a value as an expression sees it, by its column's type: NULL is
// null, text a string, json and jsonb parsed, a number an int when it is
// an integer that fits 64 bits and a double otherwise, a boolean a bool,
// bytea bytes, a timestamp a timestamp. A value that does not read as its
// type (it cannot happen with Postgres' own output) stays its text.
func typed(v outbox.Value) any {
	if v.Null() {
		return nil
	}
	s := string(v.B)
	switch v.Kind {
	case outbox.KindJSON:
		if j, err := parseJSON(v.B); err == nil {
			return j
		}
	case outbox.KindNumber:
		return number(s)
	case outbox.KindBool:
		switch s {
		case "t", "true":
			return true
		case "f", "false":
			return false
		}
	case outbox.KindBytes:
		return v.B
	case outbox.KindTimestamp:
		if t, ok := ParseTimestamp(s); ok {
			return t
		}
	}
	return s
}

// number is an int when s is an integer that fits 64 bits, a double when
// it is another number, and s otherwise.
func number(s string) any {
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		return n
	}
	if f, err := strconv.ParseFloat(s, 64); err == nil {
		return f
	}
	return s
}

// parseJSON parses a JSON document, its numbers read as number does: an id
// of 2^53 and more keeps its digits, which a double would not.
func parseJSON(b []byte) (any, error) {
	if b == nil {
		return nil, nil // NULL
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	if _, err := d.Token(); err != io.EOF {
		return nil, errors.New("more than one JSON value")
	}
	return numbers(v), nil
}

// numbers replaces the json.Numbers in v by number's values.
func numbers(v any) any {
	switch v := v.(type) {
	case json.Number:
		return number(string(v))
	case map[string]any:
		for k, e := range v {
			v[k] = numbers(e)
		}
	case []any:
		for i, e := range v {
			v[i] = numbers(e)
		}
	}
	return v
}

// filter evaluates ev's table's filter, if any: ErrFiltered when it leaves
// ev out.
func (r *Router) filter(ev *outbox.Event) error {
	p := ev.Source.Programs.Filter
	if p == nil {
		return nil
	}
	keep, err := p.Bool(&r.vars)
	switch {
	case err != nil:
		return outbox.Invalid(ev, "its filter (%s) failed: %v", p.Text, err)
	case !keep:
		return ErrFiltered
	}
	return nil
}

// exprString evaluates a topic or key expression for ev.
func (r *Router) exprString(ev *outbox.Event, key string, p *expr.Program) (string, error) {
	if r.vars.ev != ev { // on its own (Topic, Key, DeadLetter), not from Record
		if err := r.vars.prepare(ev); err != nil {
			return "", err
		}
		defer r.vars.release()
	}
	s, _, err := p.String(&r.vars)
	if err != nil {
		return "", outbox.Invalid(ev, "its %s (%s) failed: %v", key, p.Text, err)
	}
	return s, nil
}

// exprRecord applies ev's table's partition and header expressions to rec.
func (r *Router) exprRecord(ev *outbox.Event, rec *kgo.Record) error {
	p := ev.Source.Programs
	if p.Partition != nil {
		n, err := p.Partition.Int(&r.vars)
		if err != nil {
			return outbox.Invalid(ev, "its expressions.partition (%s) failed: %v", p.Partition.Text, err)
		}
		if n < 0 || n > math.MaxInt32 {
			return outbox.Invalid(ev, "its expressions.partition (%s) gave %d, which is no partition: partitions are numbered from 0", p.Partition.Text, n)
		}
		sink.Pin(rec, int32(n))
	}
	for _, h := range p.Headers {
		s, ok, err := h.Program.String(&r.vars)
		if err != nil {
			return outbox.Invalid(ev, "its expressions.headers.%s (%s) failed: %v", h.Name, h.Program.Text, err)
		}
		if ok {
			rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: h.Name, Value: []byte(s)})
		}
	}
	return nil
}

// checkHeaderNames refuses an expression header named as a header the
// table already sends, or as a dead letter's: two values under one name
// would leave a consumer to guess.
func checkHeaderNames(t *outbox.Source, tr *tableRoute) error {
	if t.Programs == nil {
		return nil
	}
	taken := map[string]bool{HeaderTraceparent: t.Columns[outbox.FieldTraceparent] != ""}
	for _, m := range tr.meta {
		taken[m.name] = true
	}
	for _, p := range tr.headerExtras {
		taken[p.name] = true
	}
	for _, h := range t.Programs.Headers {
		if taken[h.Name] {
			return fmt.Errorf("%s: expressions.headers.%s: the table already sends a header %s (a metadata or additional column's); name this one otherwise, or rename that one under headers", t, h.Name, h.Name)
		}
		if strings.HasPrefix(h.Name, "dead_letter_") {
			return fmt.Errorf("%s: expressions.headers.%s: names starting with dead_letter_ are the dead letters'; name this one otherwise", t, h.Name)
		}
	}
	return nil
}

// deadLetterHeaders appends to h the headers of ev's table's expressions
// that evaluate: a dead letter keeps what can still be worked out, and one
// of them may be why ev is invalid.
func (r *Router) deadLetterHeaders(ev *outbox.Event, h []kgo.RecordHeader) []kgo.RecordHeader {
	p := ev.Source.Programs
	if p == nil || len(p.Headers) == 0 || r.vars.prepare(ev) != nil {
		return h
	}
	defer r.vars.release()
	for _, x := range p.Headers {
		if s, ok, err := x.Program.String(&r.vars); err == nil && ok {
			h = append(h, kgo.RecordHeader{Key: x.Name, Value: []byte(s)})
		}
	}
	return h
}
