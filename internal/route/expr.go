package route

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
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
// it, and nothing of one event is read for another. It holds copies of
// what it reads of the event, not the event: a pointer kept in the Router
// would make every event escape to the heap, with expressions or not.
type vars struct {
	active     bool // between prepare and release
	fields     [outbox.NumFields]outbox.Value
	commitLSN  pglogrepl.LSN
	commitTime time.Time
	size       int // the event's, for expr.Program.Bool
	payload    any // the table's payload Object, or the whole payload parsed
	row        any // the table's row Object
}

// exprObjects are a table's Objects (expr.Object), filled for each event:
// the payload's members and the row's columns its expressions read.
type exprObjects struct {
	payload, row *expr.Object
}

func newExprObjects(t *outbox.Source) exprObjects {
	var o exprObjects
	if p := t.Programs; p != nil {
		if p.PayloadMembers != nil {
			o.payload = expr.NewObject(p.PayloadMembers)
		}
		if len(p.Row) > 0 {
			names := make([]string, len(p.Row))
			for i, c := range p.Row {
				names[i] = c.Name
			}
			o.row = expr.NewObject(names)
		}
	}
	return o
}

// prepare reads what ev's table's expressions read of it: the payload
// parsed (only the members they read, when they read it by member), the
// row's columns typed. A payload that is not JSON is the event's problem.
func (v *vars) prepare(tr *tableRoute, ev *outbox.Event) error {
	p := ev.Source.Programs
	v.active, v.fields, v.commitLSN, v.commitTime = true, ev.Fields, ev.CommitLSN, ev.CommitTime
	v.payload, v.row, v.size = nil, nil, 64
	for f := range ev.Fields {
		v.size += len(ev.Fields[f].B)
	}
	for _, x := range ev.Extra {
		v.size += len(x.B)
	}
	if p.Payload {
		var err error
		switch b := ev.Fields[outbox.FieldPayload].B; {
		case b == nil:
			v.payload = expr.Null
		case tr.objects.payload != nil:
			err = tr.objects.payload.ReadJSON(b)
			v.payload = tr.objects.payload
		default:
			v.payload, err = expr.JSON(b)
		}
		if err != nil {
			v.release()
			return outbox.Invalid(ev, "the table's expressions read payload, and its payload is not JSON they can read: %v", err)
		}
	}
	if row := tr.objects.row; row != nil {
		for i, c := range p.Row {
			row.Set(i, typed(ev.Extra[c.Extra]))
		}
		v.row = row
	}
	return nil
}

func (v *vars) release() { *v = vars{} }

// ResolveName is a variable's value: docs/config.md, "Expressions", says
// each one's type.
func (v *vars) ResolveName(name string) (any, bool) {
	switch name {
	case expr.Row:
		return v.row, true
	case expr.Payload:
		return v.payload, true
	case expr.CommitLSN:
		return expr.Text(v.commitLSN.String()), true
	case expr.CommitTime:
		return expr.Time(v.commitTime), true
	}
	if f, ok := outbox.FieldByName(name); ok {
		return typed(v.fields[f]), true
	}
	return nil, false
}

func (v *vars) Parent() expr.Activation { return nil }

// typed is a value as an expression sees it, by its column's type: NULL is
// null, text a string, json and jsonb parsed, a number an int when it is
// an integer that fits 64 bits and a double otherwise, a boolean a bool,
// bytea bytes, a timestamp a timestamp. A number too large for a double
// (a numeric of 400 digits), or JSON that holds one, is an error that an
// expression reading it fails on (expr.Number). Another value that does not
// read as its type (it cannot happen with Postgres' own output) stays its
// text.
func typed(v outbox.Value) any {
	if v.Null() {
		return expr.Null
	}
	switch v.Kind {
	case outbox.KindJSON:
		j, err := expr.JSON(v.B)
		if err != nil {
			return expr.Failed(fmt.Errorf("its JSON: %w", err))
		}
		return j
	case outbox.KindNumber:
		return expr.Number(string(v.B))
	case outbox.KindBool:
		switch string(v.B) {
		case "t", "true":
			return expr.Bool(true)
		case "f", "false":
			return expr.Bool(false)
		}
	case outbox.KindBytes:
		return expr.Bytes(v.B)
	case outbox.KindTimestamp:
		if t, ok := ParseTimestamp(string(v.B)); ok {
			return expr.Time(t)
		}
	}
	return expr.Text(string(v.B))
}

// filter evaluates ev's table's filter, if any: ErrFiltered when it leaves
// ev out.
func (r *Router) filter(ev *outbox.Event) error {
	p := ev.Source.Programs.Filter
	if p == nil {
		return nil
	}
	keep, err := p.Bool(&r.vars, r.vars.size)
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
	if !r.vars.active { // on its own (Topic, Key, DeadLetter), not from Record
		if err := r.vars.prepare(r.routes[ev.Source], ev); err != nil {
			return "", err
		}
		defer r.vars.release()
	}
	s, _, err := p.String(&r.vars, r.vars.size)
	if err != nil {
		return "", outbox.Invalid(ev, "its %s (%s) failed: %v", key, p.Text, err)
	}
	return s, nil
}

// exprRecord applies ev's table's partition and header expressions to rec.
func (r *Router) exprRecord(ev *outbox.Event, rec *kgo.Record) error {
	p := ev.Source.Programs
	if p.Partition != nil {
		n, err := p.Partition.Int(&r.vars, r.vars.size)
		if err != nil {
			return outbox.Invalid(ev, "its expressions.partition (%s) failed: %v", p.Partition.Text, err)
		}
		if n < 0 || n > math.MaxInt32 {
			return outbox.Invalid(ev, "its expressions.partition (%s) gave %d, which is no partition: partitions are numbered from 0", p.Partition.Text, n)
		}
		sink.Pin(rec, int32(n))
	}
	for _, h := range p.Headers {
		s, ok, err := h.Program.String(&r.vars, r.vars.size)
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
	taken := map[string]bool{HeaderTraceparent: t.Columns[outbox.FieldTraceparent] != ""}
	for _, m := range tr.meta {
		if err := reserved(t, "headers", m.name); err != nil {
			return err
		}
		taken[m.name] = true
	}
	for _, p := range tr.headerExtras {
		if err := reserved(t, "headers", p.name); err != nil {
			return err
		}
		taken[p.name] = true
	}
	if t.Programs == nil {
		return nil
	}
	for _, h := range t.Programs.Headers {
		if taken[h.Name] {
			return fmt.Errorf("%s: expressions.headers.%s: the table already sends a header %s (a metadata or additional column's); name this one otherwise, or rename that one under headers", t, h.Name, h.Name)
		}
		if err := reserved(t, "expressions.headers", h.Name); err != nil {
			return err
		}
	}
	return nil
}

// reserved refuses a header of t's records named as the connector's own
// on a dead letter or a parked record: a redrive reads those back, and a
// row's value under one of those names would steer it.
func reserved(t *outbox.Source, where, name string) error {
	for _, prefix := range []string{"dead_letter_", "parked_"} {
		if strings.HasPrefix(name, prefix) {
			return fmt.Errorf("%s: %s: header %s: names starting with %s are the connector's, on dead letters and parked records; name this one otherwise", t, where, name, prefix)
		}
	}
	return nil
}

// deadLetterHeaders appends to h the headers of ev's table's expressions
// that evaluate: a dead letter keeps what can still be worked out, and one
// of them may be why ev is invalid.
func (r *Router) deadLetterHeaders(ev *outbox.Event, h []kgo.RecordHeader) []kgo.RecordHeader {
	p := ev.Source.Programs
	if p == nil || len(p.Headers) == 0 || r.vars.prepare(r.routes[ev.Source], ev) != nil {
		return h
	}
	defer r.vars.release()
	for _, x := range p.Headers {
		if s, ok, err := x.Program.String(&r.vars, r.vars.size); err == nil && ok {
			h = append(h, kgo.RecordHeader{Key: x.Name, Value: []byte(s)})
		}
	}
	return h
}
