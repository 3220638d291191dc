package expr

import (
	"errors"
	"fmt"

	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"
	"cel.dev/cel-go/interpreter"
)

// Activation supplies one event's variables to an evaluation: ResolveName
// returns a variable's value as a Go value (string, int64, float64, bool,
// []byte, time.Time, nil for null, map[string]any and []any for JSON) or a
// cel-go one, and false for a name it does not have; Parent returns nil.
// The caller implements it without importing cel-go: this is cel-go's
// interpreter.Activation.
type Activation = interpreter.Activation

// ErrCost is an evaluation stopped at CostLimit.
var ErrCost = fmt.Errorf("it reached the cost limit of %d for one event", CostLimit)

// Bool evaluates a filter. size is the event's, in bytes: at least the
// sum of its values' lengths and 64 (commit_lsn and commit_time). No
// string, list or map an expression reads from the event, nor any it
// builds of them, is longer, and so it bounds what an evaluation costs:
// on an event small enough, the cost need not be counted.
func (p *Program) Bool(a Activation, size int) (bool, error) {
	v, err := p.eval(a, size)
	if err != nil {
		return false, err
	}
	b, ok := v.(types.Bool)
	if !ok {
		return false, p.wrongType(v)
	}
	return bool(b), nil
}

// String evaluates a topic, key or header expression, as Bool does. ok is
// false for a header expression that gave null (no header).
func (p *Program) String(a Activation, size int) (s string, ok bool, err error) {
	v, err := p.eval(a, size)
	if err != nil {
		return "", false, err
	}
	switch v := v.(type) {
	case types.String:
		return string(v), true, nil
	case types.Null:
		if p.want == WantHeader {
			return "", false, nil
		}
	}
	return "", false, p.wrongType(v)
}

// Int evaluates a partition expression, as Bool does.
func (p *Program) Int(a Activation, size int) (int64, error) {
	v, err := p.eval(a, size)
	if err != nil {
		return 0, err
	}
	n, ok := v.(types.Int)
	if !ok {
		return 0, p.wrongType(v)
	}
	return int64(n), nil
}

func (p *Program) eval(a Activation, size int) (ref.Val, error) {
	prg := p.prg
	if p.fast != nil && size <= p.fastUpTo {
		prg = p.fast
	}
	v, _, err := prg.Eval(a)
	if err != nil {
		var cancelled interpreter.EvalCancelledError
		if errors.As(err, &cancelled) && cancelled.Cause == interpreter.CostLimitExceeded {
			return nil, ErrCost
		}
		return nil, err
	}
	return v, nil
}

func (p *Program) wrongType(v ref.Val) error {
	return fmt.Errorf("it gave %s, not %s", v.Type().(ref.Type).TypeName(), p.want)
}
