package exprcost

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"

	"cel.dev/cel-go/cel"
	"cel.dev/cel-go/checker"
	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"
	"cel.dev/cel-go/interpreter"
)

// The tests run expressions as package expr runs a table's: over its
// variables, refused on its estimate, counted against its limit. These are
// expr's AssumedSize, MaxEstimatedCost and CostLimit, and its variables
// (with the fields its tests declare), written again here: expr imports
// this package, so its tests cannot import expr.
const (
	assumedSize      = 1_000
	maxEstimatedCost = 100_000
	costLimit        = 1_000_000
)

var variables = map[string]bool{"row": true, "payload": true, "commit_lsn": true, "commit_time": true}

// fields are the event's fields (but payload, a variable of its own).
var fields = []string{"id", "aggregate_type", "aggregate_id", "event_type", "timestamp", "version", "tenant", "traceparent"}

func init() {
	for _, f := range fields {
		variables[f] = true
	}
}

// env is an environment of Functions over expr's variables.
type env struct {
	cel                *cel.Env
	tracker            *tracker
	counted, uncounted []cel.ProgramOption
}

func newEnv(t testing.TB) *env {
	t.Helper()
	opts := []cel.EnvOption{
		cel.Variable("row", cel.MapType(cel.StringType, cel.DynType)),
		cel.Variable("payload", cel.DynType),
		cel.Variable("commit_lsn", cel.StringType),
		cel.Variable("commit_time", cel.TimestampType),
	}
	for _, f := range fields {
		opts = append(opts, cel.Variable(f, cel.DynType))
	}
	c, err := cel.NewEnv(append(opts, Functions()...)...)
	if err != nil {
		t.Fatal(err)
	}
	counted, err := Counted(c, costLimit)
	if err != nil {
		t.Fatal(err)
	}
	return &env{cel: c, tracker: newTracker(c), counted: counted, uncounted: Uncounted()}
}

// estimate is the checker's estimate of a's cost on an event of size bytes.
func (e *env) estimate(a *cel.Ast, size uint64) (checker.CostEstimate, error) {
	return e.cel.EstimateCost(a, NewEstimator(a, variables, size))
}

// errRefused is an expression expr's Compile refuses: it does not give
// the type wanted, or its estimate on an event of assumedSize is over
// maxEstimatedCost. (Check's refusals are a *Refusal.)
var errRefused = errors.New("refused")

// compile is text checked and planned to be counted, as expr's Compile
// does when text gives want (or dyn), Check takes it, and it is estimated
// within maxEstimatedCost.
func (e *env) compile(text string, want *types.Type) (*cel.Ast, cel.Program, error) {
	if strings.TrimSpace(text) == "" {
		return nil, nil, errRefused
	}
	a, iss := e.cel.Compile(text)
	if iss.Err() != nil {
		return nil, nil, iss.Err()
	}
	if k := a.OutputType().Kind(); k != types.DynKind && k != want.Kind() {
		return nil, nil, errRefused
	}
	if err := Check(a.NativeRep()); err != nil {
		return nil, nil, err
	}
	est, err := e.estimate(a, assumedSize)
	if err != nil {
		return nil, nil, err
	}
	if est.Max > maxEstimatedCost {
		return nil, nil, errRefused
	}
	prg, err := e.cel.Program(a, e.counted...)
	if err != nil {
		return nil, nil, err
	}
	return a, prg, nil
}

// atLimit reports whether err is an evaluation stopped at its limit.
func atLimit(err error) bool {
	var cancelled interpreter.EvalCancelledError
	return errors.As(err, &cancelled) && cancelled.Cause == interpreter.CostLimitExceeded
}

func vars(t testing.TB, m map[string]any) interpreter.Activation {
	t.Helper()
	a, err := interpreter.NewActivation(m)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// payloadOf is the JSON text as expr.JSON reads an event's payload: its
// numbers as expr.Number reads them, an int when it is an integer that
// fits 64 bits, a double otherwise.
func payloadOf(t testing.TB, text []byte) ref.Val {
	t.Helper()
	d := json.NewDecoder(bytes.NewReader(text))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		t.Fatal(err)
	}
	return types.DefaultTypeAdapter.NativeToValue(numbers(v))
}

func numbers(v any) any {
	switch v := v.(type) {
	case json.Number:
		if n, err := strconv.ParseInt(string(v), 10, 64); err == nil {
			return types.Int(n)
		}
		if f, err := strconv.ParseFloat(string(v), 64); err == nil {
			return types.Double(f)
		}
		return types.String(v)
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
