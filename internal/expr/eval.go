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

// Bool evaluates a filter.
func (p *Program) Bool(a Activation) (bool, error) {
	v, err := p.eval(a)
	if err != nil {
		return false, err
	}
	b, ok := v.(types.Bool)
	if !ok {
		return false, p.wrongType(v)
	}
	return bool(b), nil
}

// String evaluates a topic, key or header expression. ok is false for a
// header expression that gave null (no header).
func (p *Program) String(a Activation) (s string, ok bool, err error) {
	v, err := p.eval(a)
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

// Int evaluates a partition expression.
func (p *Program) Int(a Activation) (int64, error) {
	v, err := p.eval(a)
	if err != nil {
		return 0, err
	}
	n, ok := v.(types.Int)
	if !ok {
		return 0, p.wrongType(v)
	}
	return int64(n), nil
}

func (p *Program) eval(a Activation) (ref.Val, error) {
	v, _, err := p.prg.Eval(a)
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
