package outbox

import (
	"fmt"
	"slices"
	"sync"

	"github.com/outboxcdc/cdc/internal/expr"
)

// Expressions are tables[].expressions: CEL expressions evaluated for each
// event (docs/config.md, "Expressions"). Topic and Key replace the topic
// and key templates, Partition pins the record's partition, and Headers
// adds a header per name. "" (nil) leaves each out.
type Expressions struct {
	Topic     string
	Key       string
	Partition string
	Headers   map[string]string
}

// Programs are a table's filter and expressions, compiled by Validate. A
// table with neither has none (Source.Programs is nil), so that its events
// pay for nothing but that nil check.
type Programs struct {
	// Filter is tables[].filter: an event it gives false for is left out.
	Filter *expr.Program
	// Topic, Key and Partition are expressions.topic, .key and .partition.
	Topic, Key, Partition *expr.Program
	// Headers are expressions.headers, by name.
	Headers []HeaderProgram
	// Payload says whether one of them reads payload, which is then
	// parsed once per event: only PayloadMembers, when each of them reads
	// only members of it by name, and the whole of it when it is nil. Row
	// lists the columns they select from row, each with its index in
	// Source.Extra (and Event.Extra).
	Payload        bool
	PayloadMembers []string
	Row            []RowColumn
}

// HeaderProgram is one of expressions.headers.
type HeaderProgram struct {
	Name    string
	Program *expr.Program
}

// RowColumn is a column an expression reads as row.<Name>: Event.Extra[Extra].
type RowColumn struct {
	Name  string
	Extra int
}

// exprEnv declares the fields' names: one environment serves every table,
// and building it costs milliseconds.
var exprEnv = sync.OnceValues(func() (*expr.Env, error) { return expr.NewEnv(FieldNames[:]) })

// compileExpressions compiles the filter and expressions of t into
// t.Programs, and adds the columns they read from row to Extra. An
// expression for the topic or the key replaces the template, so setting
// both is an error; so is an expression that reads a field not mapped.
func (t *Source) compileExpressions() error {
	t.Programs = nil
	x := t.Expressions
	if t.Filter == "" && x.Topic == "" && x.Key == "" && x.Partition == "" && len(x.Headers) == 0 {
		return nil
	}
	if x.Topic != "" && t.Topic != "" {
		return fmt.Errorf("%s: topic and expressions.topic are both set; the expression replaces the template: remove one", t)
	}
	if x.Key != "" && t.Key != "" {
		return fmt.Errorf("%s: key and expressions.key are both set; the expression replaces the template: remove one", t)
	}
	env, err := exprEnv()
	if err != nil {
		return err
	}
	p := &Programs{}
	compile := func(key, text string, want expr.Want) (*expr.Program, error) {
		if text == "" {
			return nil, nil
		}
		prg, err := env.Compile(text, want)
		if err != nil {
			return nil, fmt.Errorf("%s: %s: %w", t, key, err)
		}
		if err := t.readable(key, prg, p); err != nil {
			return nil, err
		}
		return prg, nil
	}
	if p.Filter, err = compile("filter", t.Filter, expr.WantBool); err != nil {
		return err
	}
	if p.Topic, err = compile("expressions.topic", x.Topic, expr.WantString); err != nil {
		return err
	}
	if p.Key, err = compile("expressions.key", x.Key, expr.WantString); err != nil {
		return err
	}
	if p.Partition, err = compile("expressions.partition", x.Partition, expr.WantInt); err != nil {
		return err
	}
	names := make([]string, 0, len(x.Headers))
	for name := range x.Headers {
		names = append(names, name)
	}
	slices.Sort(names) // the headers' order on the record does not depend on a map's
	for _, name := range names {
		if name == "" {
			return fmt.Errorf("%s: expressions.headers: a header needs a name", t)
		}
		prg, err := compile("expressions.headers."+name, x.Headers[name], expr.WantHeader)
		if err != nil {
			return err
		}
		p.Headers = append(p.Headers, HeaderProgram{Name: name, Program: prg})
	}
	t.Programs = p
	return nil
}

// readable checks that the fields prg reads are mapped, and notes in p
// what it reads of the event, adding its row columns to t.Extra.
func (t *Source) readable(key string, prg *expr.Program, p *Programs) error {
	for _, name := range prg.Fields {
		if f, ok := FieldByName(name); ok && t.Columns[f] == "" {
			return fmt.Errorf("%s: %s reads %s, but that field is not mapped to a column; map it under columns, or read the column as row.<column>", t, key, name)
		}
	}
	if prg.Payload {
		if p.Payload && p.PayloadMembers == nil || prg.PayloadMembers == nil {
			p.PayloadMembers = nil // one of them reads it whole
		} else {
			for _, m := range prg.PayloadMembers {
				if !slices.Contains(p.PayloadMembers, m) {
					p.PayloadMembers = append(p.PayloadMembers, m)
				}
			}
		}
		p.Payload = true
	}
	for _, col := range prg.Row {
		if !slices.ContainsFunc(p.Row, func(c RowColumn) bool { return c.Name == col }) {
			p.Row = append(p.Row, RowColumn{Name: col, Extra: t.addExtra(col)})
		}
	}
	return nil
}
