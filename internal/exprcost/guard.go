package exprcost

import (
	"math"
	"strconv"
	"strings"
	"unicode/utf8"

	"cel.dev/cel-go/cel"
	"cel.dev/cel-go/common/cost"
	"cel.dev/cel-go/common/functions"
	"cel.dev/cel-go/common/operators"
	"cel.dev/cel-go/common/overloads"
	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"
	"cel.dev/cel-go/common/types/traits"
	"cel.dev/cel-go/interpreter"
)

// cel-go charges a call once it has returned: the count stops an
// evaluation after the call that took it past its limit, however much that
// one call did. On a large event, one call can do far more than the limit:
// payload.s.matches(payload.s) on a 420 KB event ran 3.2 s (FuzzEval found
// it) to be charged 27 times the limit; a replace or a split of a 100 MB
// string builds gigabytes first. So the counted program checks each call
// before it runs: what it will be charged at the least, from its operands
// (its model with a result not yet built, and the result's least size
// where the charge counts the result: lower bounds, so that the check stops
// no evaluation the count would let finish), must fit what the limit has
// left, or the evaluation stops there, as the count stops one. Then no
// call runs that takes an evaluation past its limit, and an evaluation's
// time and what it builds are bounded by the limit, not by the event.

// Counted is what plans a program of env whose evaluation counts its cost
// and stops once it would pass limit (interpreter.EvalCancelledError,
// interpreter.CostLimitExceeded): the limit; the tracker, which charges
// what cel-go's count does not (format, deep comparisons, a call on dyn
// operands by what it turns out to be); and the guard, which checks each
// call's charge before it runs. env declares Functions (and CEL's
// standard library): an overload bounds does not list is not bounded. A
// program that does not count is planned with Uncounted.
func Counted(env *cel.Env, limit uint64) ([]cel.ProgramOption, error) {
	g, err := guard(env)
	if err != nil {
		return nil, err
	}
	return []cel.ProgramOption{cel.CostLimit(limit), cel.CostTracking(newTracker(env)), g}, nil
}

// guard is the decorator that puts the check before every call the counted
// program makes, but those that cost what their operands did (&&, ||, ?:),
// select (an index) or compare (== and !=, charged as deep as the
// shallower operand, which they read at most once): cel-go's node for the
// call is replaced by one that evaluates the operands, checks, and calls the
// same implementation cel-go's dispatch would.
func guard(env *cel.Env) (cel.ProgramOption, error) {
	bindings := map[string]*functions.Overload{}
	for _, f := range env.Functions() {
		bs, err := f.Bindings()
		if err != nil {
			return nil, err
		}
		for _, b := range bs {
			bindings[b.Operator] = b
		}
	}
	return cel.CustomDecoratorV2(func(i interpreter.InterpretableV2) (interpreter.InterpretableV2, error) {
		call, ok := i.(interpreter.InterpretableCall)
		if !ok {
			return i, nil
		}
		switch call.Function() {
		case operators.LogicalAnd, operators.LogicalOr, operators.Conditional, operators.Index, operators.OptIndex, operators.OptSelect,
			operators.Equals, operators.NotEquals, operators.NotStrictlyFalse, operators.OldNotStrictlyFalse:
			return i, nil
		}
		if call.Function() == overloads.Matches { // its pattern compiled once, here (regex.go)
			return precompiled(call)
		}
		impl := bindings[call.OverloadID()]
		if impl == nil {
			impl = bindings[call.Function()]
		}
		if impl == nil || impl.NonStrict || impl.Async != nil || impl.LateBound {
			return i, nil
		}
		return &checked{InterpretableCall: call, impl: impl}, nil
	}), nil
}

// checked is a call that checks its charge before it runs.
type checked struct {
	interpreter.InterpretableCall // cel-go's node, for its ID, function, overload and operands
	impl                          *functions.Overload
}

func (c *checked) Eval(a interpreter.Activation) ref.Val {
	return interpreter.EvalActivation(a, c.Exec)
}

func (c *checked) Exec(frame *interpreter.ExecutionFrame) ref.Val {
	operands := c.Args()
	args := make([]ref.Val, len(operands))
	for i, o := range operands {
		v := o.Exec(frame)
		if types.IsUnknownOrError(v) {
			return v // as cel-go's strict call returns it, uncharged
		}
		args[i] = v
	}
	costs := frame.CostTracker()
	var least uint64
	if costs != nil && costs.Limit != nil {
		least = cost.SafeAdd(costs.CostCall(c, args, nil), leastResultCharge(c.OverloadID(), args, *costs.Limit))
		if cost.SafeAdd(costs.ActualCost(), least) > *costs.Limit {
			panic(interpreter.EvalCancelledError{Cause: interpreter.CostLimitExceeded, Message: "operation cancelled: actual cost limit exceeded"})
		}
	}
	res := c.call(args)
	if err, ok := res.(*types.Err); ok && err.NodeID() == 0 {
		res = types.LabelErrNode(c.ID(), err)
	}
	if costs != nil {
		if checkedHook != nil && costs.Limit != nil {
			checkedHook(c, args, least, costs.CostCall(c, args, res))
		}
		costs.EvalVarArgs(frame, c.ID(), c, args, res)
	}
	return res
}

// checkedHook, when the tests set it, is given each call checked: its
// operands, its least charge as the check had it, and its charge.
var checkedHook func(c interpreter.InterpretableCall, args []ref.Val, least, charged uint64)

// call is what cel-go's node for the call does with its operands' values:
// the implementation, if the first operand has the trait it needs.
func (c *checked) call(args []ref.Val) ref.Val {
	impl := c.impl
	switch {
	case len(args) > 0 && impl.OperandTrait != 0 && !args[0].Type().HasTrait(impl.OperandTrait):
	case len(args) == 0 && impl.Function != nil:
		return impl.Function()
	case len(args) == 1 && impl.Unary != nil:
		return impl.Unary(args[0])
	case len(args) == 2 && impl.Binary != nil:
		return impl.Binary(args[0], args[1])
	case impl.Function != nil:
		return impl.Function(args...)
	}
	return types.NewErr("no such overload: %s", c.Function())
}

// leastResultCharge is the least a call's charge counts for its result,
// from its operands: the model of each function that charges its result
// (a unit, or a tenth of one, for each character or element) charged for
// the least result it can give them, exactly where that is cheap to know.
// A call of another function, or one that fails (operands of other types,
// a substring out of range), counts 0: a failure's result is no string.
// What it writes is counted up to 10 characters a unit of limit, the
// evaluation's: past that, the check stops the call whatever the rest is.
func leastResultCharge(id string, args []ref.Val, limit uint64) uint64 {
	if id == "list_join" || id == "list_join_string" {
		return leastJoined(args, limit)
	}
	s, ok := stringArg(args, 0)
	if !ok {
		return 0
	}
	switch id {
	case "string_lower_ascii", "string_upper_ascii", "string_reverse":
		return chars(s)
	case "string_trim":
		return chars(strings.TrimSpace(s))
	case "string_substring_int", "string_substring_int_int":
		return leastSubstring(s, args)
	case "string_replace_string_string", "string_replace_string_string_int":
		return leastReplaced(s, args)
	case "string_split_string", "string_split_string_int":
		return leastParts(s, args)
	case overloads.StringToBytes:
		// Charged as tenth(read+written), of which the check has tenth(read).
		return cost.SafeSubtract(tenth(chars(s)+uint64(len(s))), tenth(chars(s)))
	case overloads.ExtQuoteString:
		return cost.SafeSubtract(tenth(2*chars(s)+2), tenth(chars(s)))
	case overloads.ExtFormatString:
		if len(args) == 2 {
			return tenth(leastFormatted(s, args[1], limit))
		}
	}
	return 0
}

// stringArg is args[i], if it is a string.
func stringArg(args []ref.Val, i int) (string, bool) {
	if i >= len(args) {
		return "", false
	}
	s, ok := args[i].(types.String)
	return string(s), ok
}

// intArg is args[i], if it is an int.
func intArg(args []ref.Val, i int) (int64, bool) {
	if i >= len(args) {
		return 0, false
	}
	n, ok := args[i].(types.Int)
	return int64(n), ok
}

// chars is how many characters s has, as the strings extension counts
// them.
func chars(s string) uint64 { return uint64(utf8.RuneCountInString(s)) }

// leastSubstring is the characters s.substring(start) or
// s.substring(start, end) gives, or 0 where it fails (a range out of s).
func leastSubstring(s string, args []ref.Val) uint64 {
	start, ok := intArg(args, 1)
	if !ok || start < 0 || uint64(start) > chars(s) {
		return 0 // it fails
	}
	if len(args) == 2 {
		return chars(s) - uint64(start)
	}
	end, ok := intArg(args, 2)
	if !ok || end < start || uint64(end) > chars(s) {
		return 0
	}
	return uint64(end - start)
}

// leastReplaced is the characters s.replace(old, repl[, limit]) gives:
// s's, and for each of at most limit matches of old (all, for a negative
// limit), repl's instead of old's.
func leastReplaced(s string, args []ref.Val) uint64 {
	old, ok1 := stringArg(args, 1)
	repl, ok2 := stringArg(args, 2)
	if !ok1 || !ok2 {
		return 0
	}
	n := uint64(strings.Count(s, old))
	if len(args) == 4 {
		limit, ok := intArg(args, 3)
		if !ok {
			return 0
		}
		if limit >= 0 {
			n = min(n, uint64(limit))
		}
	}
	return cost.SafeSubtract(cost.SafeAdd(chars(s), cost.SafeMultiply(n, chars(repl))), cost.SafeMultiply(n, chars(old)))
}

// leastParts is the elements s.split(sep[, limit]) gives: a part more than
// sep's matches (a character each, for an empty sep), at most limit (all,
// for a negative limit).
func leastParts(s string, args []ref.Val) uint64 {
	sep, ok := stringArg(args, 1)
	if !ok {
		return 0
	}
	parts := uint64(strings.Count(s, sep)) + 1
	if sep == "" {
		parts = chars(s)
	}
	if len(args) == 3 {
		limit, ok := intArg(args, 2)
		if !ok {
			return 0
		}
		if limit >= 0 {
			parts = min(parts, uint64(limit))
		}
	}
	return parts
}

// leastJoined is the characters list.join([sep]) writes: the elements'
// and a separator between each two, counted up to 10 characters a unit of
// limit; 0 if an element is not a string, for which join fails.
func leastJoined(args []ref.Val, limit uint64) uint64 {
	l, ok := args[0].(traits.Lister)
	if !ok {
		return 0
	}
	sep, ok := stringArg(args, 1)
	if len(args) == 2 && !ok {
		return 0
	}
	var n, written uint64
	for it := l.Iterator(); it.HasNext() == types.True && written <= cost.SafeMultiply(10, limit); n++ {
		e, ok := it.Next().(types.String)
		if !ok {
			return 0 // it fails
		}
		written = cost.SafeAdd(written, chars(string(e)))
	}
	return cost.SafeAdd(written, cost.SafeMultiply(cost.SafeSubtract(n, 1), chars(sep)))
}

// leastFormatted is the least format writes of the format s with the
// arguments list: nothing if it fails (a clause it cannot read, or one
// with no argument, or of the wrong type for its verb); else the format's
// characters but its clauses', and, for each clause, what it writes of its
// argument: for %s, the argument written out (counted up to 10 characters
// a unit of limit); for %x of a string or bytes, 2 hex digits a byte; for
// a number, a digit.
func leastFormatted(s string, list ref.Val, limit uint64) uint64 {
	l, ok := list.(traits.Lister)
	if !ok {
		return 0
	}
	verbs, other, ok := clauses(s)
	if !ok || int64(len(verbs)) > int64(l.Size().(types.Int)) {
		return 0
	}
	var n uint64
	for i, v := range verbs {
		arg := l.Get(types.Int(i))
		if !takes(v, arg) {
			return 0
		}
		switch arg := arg.(type) {
		case types.String:
			if v == 'x' || v == 'X' {
				n = cost.SafeAdd(n, 2*uint64(len(arg))) // 2 hex digits a byte
				continue
			}
		case types.Bytes:
			if v == 'x' || v == 'X' {
				n = cost.SafeAdd(n, 2*uint64(len(arg)))
				continue
			}
		}
		if v == 's' {
			n = cost.SafeAdd(n, written(arg, cost.SafeMultiply(10, limit)))
		} else {
			n++ // a number has a digit at least
		}
	}
	return cost.SafeAdd(n, other)
}

// clauses are the verbs of the format s's clauses as the strings extension
// reads them, and the characters it writes of the rest of s (a "%%" is
// one); false if it would refuse a clause ("%.f", a precision past 100, a
// verb it does not know, a '%' at the end).
func clauses(s string) (verbs []byte, other uint64, ok bool) {
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			if utf8.RuneStart(s[i]) {
				other++ // a character's first byte (a lone continuation byte, also one, is not counted)
			}
			continue
		}
		if i+1 < len(s) && s[i+1] == '%' {
			other++
			i++
			continue
		}
		j := i + 1
		if j < len(s) && s[j] == '.' {
			k := j + 1
			for k < len(s) && '0' <= s[k] && s[k] <= '9' {
				k++
			}
			if p, err := strconv.Atoi(s[j+1 : k]); err != nil || p > 100 {
				return nil, 0, false
			}
			j = k
		}
		if j == len(s) || strings.IndexByte("sdfebxXo", s[j]) < 0 {
			return nil, 0, false
		}
		verbs = append(verbs, s[j])
		i = j
	}
	return verbs, other, true
}

// takes reports whether the strings extension's clause verb formats v
// (formatting_v2.go): %s every value an event holds or an expression makes,
// the others numbers, and %x strings and bytes too.
func takes(verb byte, v ref.Val) bool {
	switch v.(type) {
	case types.Int, types.Uint:
		return true
	case types.Double:
		return strings.IndexByte("sdfe", verb) >= 0
	case types.Bool:
		return verb == 's' || verb == 'b'
	case types.String, types.Bytes:
		return verb == 's' || verb == 'x' || verb == 'X'
	}
	return verb == 's'
}

// written is the characters %s writes of v (formatting_v2.go's format),
// counted up to limit or a little past it; 0 for a value it refuses.
func written(v ref.Val, limit uint64) uint64 {
	var buf [400]byte
	switch v := v.(type) {
	case types.String:
		if uint64(len(v)) > cost.SafeMultiply(4, limit) {
			return cost.SafeAdd(limit, 1)
		}
		return uint64(utf8.RuneCountInString(string(v)))
	case types.Bytes:
		return uint64(utf8.RuneCount(v))
	case types.Double:
		switch f := float64(v); {
		case math.IsNaN(f):
			return 3
		case math.IsInf(f, -1):
			return 9
		case math.IsInf(f, 1):
			return 8
		}
		return uint64(len(strconv.AppendFloat(buf[:0], float64(v), 'f', -1, 64)))
	case types.Int:
		return uint64(len(strconv.AppendInt(buf[:0], int64(v), 10)))
	case types.Uint:
		return uint64(len(strconv.AppendUint(buf[:0], uint64(v), 10)))
	case types.Bool:
		return uint64(len(strconv.AppendBool(buf[:0], bool(v))))
	case types.Null:
		return 4
	case types.Duration:
		return uint64(len(strconv.AppendFloat(buf[:0], v.Seconds(), 'f', -1, 64))) + 1
	case types.Timestamp:
		return uint64(len(v.UTC().AppendFormat(buf[:0], "2006-01-02T15:04:05.999999999Z07:00")))
	case traits.Mapper:
		n := uint64(0) // "{" and "}", less the ", " before the first entry
		for it := v.Iterator(); it.HasNext() == types.True && n <= limit; {
			k := it.Next()
			n = cost.SafeAdd(n, 4, written(k, limit), written(v.Get(k), limit)) // ", " and ": "
		}
		return max(n, 2)
	case traits.Lister:
		n := uint64(0) // "[" and "]", less the ", " before the first element
		for it := v.Iterator(); it.HasNext() == types.True && n <= limit; {
			n = cost.SafeAdd(n, 2, written(it.Next(), limit)) // ", "
		}
		return max(n, 2)
	}
	if t, ok := v.(ref.Type); ok {
		return uint64(len(t.TypeName()))
	}
	return 0
}
