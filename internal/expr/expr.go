package expr

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"cel.dev/cel-go/cel"
	"cel.dev/cel-go/common/ast"
	"cel.dev/cel-go/common/operators"
	"cel.dev/cel-go/common/types"

	"github.com/outboxcdc/cdc/internal/exprcost"
)

// The variables every expression may read besides the event's fields.
const (
	// Row is every column of the row (or member of a logical decoding
	// message) an expression selects, by name: a map of the column's value.
	Row = "row"
	// Payload is the payload field parsed as JSON.
	Payload = "payload"
	// CommitLSN is the transaction's commit LSN as text ("0/16B3748"),
	// CommitTime its commit time.
	CommitLSN  = "commit_lsn"
	CommitTime = "commit_time"
)

// The cost bounds (docs/config.md, "Expressions"). A cost unit is cel-go's:
// about one operation, a tenth of a byte for a string scan.
const (
	// AssumedSize is the size Compile's estimate gives every string,
	// list and map read from an event: at most this many bytes or
	// elements.
	AssumedSize = 1_000
	// MaxEstimatedCost is the most an expression may cost, as cel-go
	// estimates it on an event of AssumedSize, for Compile to accept it.
	MaxEstimatedCost = 100_000
	// CostLimit stops one evaluation: ten times the estimate's bound, so
	// that an event larger than assumed still evaluates, and one far
	// larger is an invalid event rather than seconds of CPU. It is
	// Kubernetes' limit on one call of a CRD's validation rule.
	CostLimit = 1_000_000
)

// Want is the type an expression must give.
type Want uint8

const (
	WantBool   Want = iota // a filter: true keeps the event
	WantString             // a topic or key
	WantHeader             // a header's value: a string, or null for no header
	WantInt                // a partition
)

func (w Want) String() string {
	return [...]string{"a bool", "a string", "a string or null", "an int"}[w]
}

// Env compiles expressions over one set of variables: the event's fields
// (named at NewEnv, each of any type: a column's type is known only once
// its relation is streamed), Row, Payload, CommitLSN and CommitTime. It is
// safe for concurrent use.
type Env struct {
	cel       *cel.Env
	fields    []string
	variables map[string]bool
	// counted plans a program that counts its cost against CostLimit
	// and checks each call before it runs (exprcost.Counted), uncounted
	// one that does not, as bounded (exprcost.Uncounted).
	counted, uncounted []cel.ProgramOption
}

// NewEnv declares fields, the event's field names, beside the other
// variables. A field named Payload is the parsed payload.
func NewEnv(fields []string) (*Env, error) {
	opts := []cel.EnvOption{
		cel.Variable(Row, cel.MapType(cel.StringType, cel.DynType)),
		cel.Variable(Payload, cel.DynType),
		cel.Variable(CommitLSN, cel.StringType),
		cel.Variable(CommitTime, cel.TimestampType),
	}
	// The functions, each bounded, and their cost models: exprcost's,
	// and no other (TestFunctionsAreExprcosts).
	opts = append(opts, exprcost.Functions()...)
	e := &Env{variables: map[string]bool{Row: true, Payload: true, CommitLSN: true, CommitTime: true}}
	for _, f := range fields {
		if f == Payload {
			continue
		}
		opts = append(opts, cel.Variable(f, cel.DynType))
		e.fields = append(e.fields, f)
		e.variables[f] = true
	}
	var err error
	if e.cel, err = cel.NewEnv(opts...); err != nil {
		return nil, fmt.Errorf("declare the expressions' variables: %w", err)
	}
	if e.counted, err = exprcost.Counted(e.cel, CostLimit); err != nil {
		return nil, fmt.Errorf("declare the expressions' functions: %w", err)
	}
	e.uncounted = exprcost.Uncounted()
	return e, nil
}

// Program is one compiled expression, safe for concurrent use.
type Program struct {
	// Text is the expression as written.
	Text string
	want Want
	prg  cel.Program
	// fast is prg without cost tracking, for the events of at most
	// fastUpTo bytes, which cel-go's estimate says cannot reach CostLimit:
	// tracking allocates at every evaluation (8 of the 26 allocations a
	// filter and a key made per event; docs/benchmarks.md, "Expressions").
	fast     cel.Program
	fastUpTo int
	// Fields lists the event's fields it reads (by the names NewEnv was
	// given), Row the columns it selects from row, each once; Payload says
	// whether it reads payload, and PayloadMembers, when it reads only
	// members of it by name (payload.name, payload["name"]), which: nil
	// when it reads payload as a whole.
	Fields         []string
	Row            []string
	Payload        bool
	PayloadMembers []string
	// Cost is cel-go's estimate of its cost on an event of AssumedSize:
	// at most MaxEstimatedCost.
	Cost uint64
}

// Compile parses, type-checks and plans text, which must give want. The
// error is one line: where in text (a column, and a line when text has
// several) and what is wrong.
func (e *Env) Compile(text string, want Want) (*Program, error) {
	if strings.TrimSpace(text) == "" {
		return nil, errors.New("the expression is empty")
	}
	a, iss := e.cel.Compile(text)
	if iss != nil && iss.Err() != nil {
		return nil, issuesError(text, iss)
	}
	if !gives(a.OutputType(), want) {
		return nil, fmt.Errorf("it gives %s; it must give %s", a.OutputType(), want)
	}
	p := &Program{Text: text, want: want}
	if err := p.references(text, a.NativeRep(), e.variables); err != nil {
		return nil, err
	}
	if err := exprcost.Check(a.NativeRep()); err != nil {
		var r *exprcost.Refusal
		if errors.As(err, &r) {
			return nil, fmt.Errorf("%s: %s", position(text, a.NativeRep(), r.ID), r.Why)
		}
		return nil, err
	}
	est, err := e.cel.EstimateCost(a, exprcost.NewEstimator(a, e.variables, AssumedSize))
	if err != nil {
		return nil, fmt.Errorf("estimate its cost: %w", err)
	}
	if est.Max == math.MaxUint64 {
		return nil, errors.New("its cost has no bound: it computes a value of unknown size (a list or map built of the event's members, compared or formatted as a whole, or a member nested more than 3 lists or maps deep); " +
			"compare or format the members themselves, or string() them")
	}
	if est.Max > MaxEstimatedCost {
		return nil, fmt.Errorf("its estimated cost on an event of %d-byte strings and %d-element lists is %d, more than the %d allowed: an expression runs for every event; "+
			"loop over less (a comprehension inside another multiplies their costs), or match a smaller pattern (a match costs its compiled pattern's instructions for each character)", AssumedSize, AssumedSize, est.Max, MaxEstimatedCost)
	}
	p.Cost = est.Max
	if p.prg, err = e.cel.Program(a, e.counted...); err != nil {
		return nil, fmt.Errorf("plan the expression: %w", err)
	}
	if p.fastUpTo = e.untracked(a); p.fastUpTo > 0 {
		if p.fast, err = e.cel.Program(a, e.uncounted...); err != nil {
			return nil, fmt.Errorf("plan the expression: %w", err)
		}
	}
	return p, nil
}

// untracked is the largest event size, in bytes, on which cel-go's
// estimate of a's cost stays within CostLimit, or 0: an event holds no
// string, list or map larger than its bytes, so on such an event an
// evaluation cannot reach the limit, and need not count its cost. The
// estimate is an upper bound of what evaluation counts: every function's
// model is one (exprcost; its FuzzEval checks it), and what a function
// computes has the size its model gives, not the event's.
func (e *Env) untracked(a *cel.Ast) int {
	fits := 0
	for size := AssumedSize; size <= 1<<30; size *= 2 {
		est, err := e.cel.EstimateCost(a, exprcost.NewEstimator(a, e.variables, uint64(size)))
		if err != nil || est.Max > CostLimit {
			break
		}
		fits = size
	}
	return fits
}

// gives reports whether a checked expression of type t may give want: the
// type itself, or dyn, whose value is checked when it is evaluated.
func gives(t *types.Type, want Want) bool {
	switch t.Kind() {
	case types.DynKind:
		return true
	case types.BoolKind:
		return want == WantBool
	case types.StringKind:
		return want == WantString || want == WantHeader
	case types.IntKind:
		return want == WantInt
	case types.NullTypeKind:
		return want == WantHeader
	}
	return false
}

// issuesError makes cel-go's issues one line: each error's column (and
// line, in a text of several), and message.
func issuesError(text string, iss *cel.Issues) error {
	var msgs []string
	multiline := strings.Contains(text, "\n")
	for _, e := range iss.Errors() {
		where := fmt.Sprintf("column %d", e.Location.Column()+1)
		if multiline {
			where = fmt.Sprintf("line %d, column %d", e.Location.Line(), e.Location.Column()+1)
		}
		msg := strings.ReplaceAll(e.Message, "\n", " ")
		// A typed value on one side of ?: and null on the other is the
		// usual way to leave a header out, and CEL's checker refuses it.
		if strings.Contains(msg, "'_?_:_'") && strings.Contains(msg, "null") {
			msg += " (make the other side dyn: cond ? dyn(value) : null)"
		}
		msgs = append(msgs, where+": "+msg)
	}
	return errors.New(strings.Join(msgs, "; "))
}

// references records what p reads, from the checked AST: the variables
// named, and the columns selected from row. A use of row other than a
// selection by a literal name, and an iteration variable that hides one of
// the variables, are errors: either would make what is read unknowable
// before the event.
func (p *Program) references(text string, a *ast.AST, variables map[string]bool) error {
	refs := a.ReferenceMap()
	root := ast.NavigateAST(a)
	where := func(id int64) string { return position(text, a, id) }
	for _, c := range ast.MatchDescendants(root, ast.KindMatcher(ast.ComprehensionKind)) {
		comp := c.AsComprehension()
		for _, v := range []string{comp.IterVar(), comp.IterVar2()} {
			if variables[v] {
				return fmt.Errorf("%s: the iteration variable %s hides the variable of that name; call it something else", where(c.ID()), v)
			}
		}
	}
	whole := false
	for _, id := range ast.MatchDescendants(root, ast.KindMatcher(ast.IdentKind)) {
		ref, ok := refs[id.ID()]
		if !ok || !variables[ref.Name] {
			continue // an iteration variable
		}
		switch ref.Name {
		case Payload:
			p.Payload = true
			member, ok := selected(id)
			whole = whole || !ok
			if ok && !slices.Contains(p.PayloadMembers, member) {
				p.PayloadMembers = append(p.PayloadMembers, member)
			}
		case Row:
			col, ok := selected(id)
			if !ok {
				return fmt.Errorf("%s: read row one column at a time, by its name: row.name, or row[\"name\"] for a name that is not an identifier", where(id.ID()))
			}
			if !slices.Contains(p.Row, col) {
				p.Row = append(p.Row, col)
			}
		case CommitLSN, CommitTime:
		default:
			if !slices.Contains(p.Fields, ref.Name) {
				p.Fields = append(p.Fields, ref.Name)
			}
		}
	}
	if whole {
		p.PayloadMembers = nil
	}
	return nil
}

// position is where in text the node id of a starts: a column, and a
// line when text has several.
func position(text string, a *ast.AST, id int64) string {
	loc := a.SourceInfo().GetStartLocation(id)
	if strings.Contains(text, "\n") {
		return fmt.Sprintf("line %d, column %d", loc.Line(), loc.Column()+1)
	}
	return fmt.Sprintf("column %d", loc.Column()+1)
}

// selected is the member a use of a map variable (row, payload) selects:
// v.name, has(v.name), or v["name"] with a literal string.
func selected(id ast.NavigableExpr) (string, bool) {
	parent, ok := id.Parent()
	if !ok {
		return "", false
	}
	switch parent.Kind() {
	case ast.SelectKind:
		if s := parent.AsSelect(); s.Operand().ID() == id.ID() {
			return s.FieldName(), true
		}
	case ast.CallKind:
		call := parent.AsCall()
		if call.FunctionName() != operators.Index || len(call.Args()) != 2 || call.Args()[0].ID() != id.ID() {
			return "", false
		}
		if key := call.Args()[1]; key.Kind() == ast.LiteralKind {
			if s, ok := key.AsLiteral().(types.String); ok {
				return string(s), true
			}
		}
	}
	return "", false
}
