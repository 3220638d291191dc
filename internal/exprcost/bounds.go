package exprcost

import (
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"unicode/utf8"

	"cel.dev/cel-go/cel"
	"cel.dev/cel-go/checker"
	"cel.dev/cel-go/common/ast"
	"cel.dev/cel-go/common/cost"
	"cel.dev/cel-go/common/decls"
	"cel.dev/cel-go/common/overloads"
	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"
	"cel.dev/cel-go/common/types/traits"
)

// What bounds each function an expression can call. A cost limit holds
// only if every call is bounded twice:
//
//   - at the check, cel-go's estimate of the call's cost and of its
//     result's size, on an event of a given size (Estimator), is an upper
//     bound of what the call is charged and builds at run time on any
//     event no larger: package expr refuses an expression on the estimate,
//     and an evaluation skips counting on it (expr's Program.fastUpTo);
//   - at run time, the count charges the call at least in proportion to its
//     time and to what it builds (a tenth of a unit a character, as cel-go
//     charges a string's concatenation; a unit an element), so that an
//     evaluation that builds much, or works long, reaches its limit.
//
// cel-go gives most of its functions such a model. Those it does not, or
// whose model is not an upper bound, have one here; bounds lists every
// overload an environment of Functions declares and which it is, and
// TestEveryFunctionIsBounded fails on an overload it does not list, as a
// function a newer cel-go or a new option adds would be.

// bounded says how an overload is bounded.
type bounded uint8

const (
	// scalar: it takes constant time and gives a value of fixed size (a
	// bool, a number, a timestamp, a duration, a type), which is what
	// cel-go assumes of a function without a model: a cost of 1, a result
	// sized by its type.
	scalar bounded = iota
	// celgo: cel-go's own model (its standard library's, or its strings
	// extension's from version 5), read and found to bound the cost and the
	// result as the implementation is.
	celgo
	// modeled: a model of ours, in models, registered with cel.CostModel.
	modeled
	// manual: worked out here, at the check by Estimator.EstimateCallCost and
	// at run time by tracker.CallCost, from what a declarative model cannot
	// say: how many characters format writes, how deep two values are
	// compared.
	manual
)

// bound is one overload's entry in bounds: how it is bounded, and why that
// holds.
type bound struct {
	by  bounded
	why string
}

// bounds is every overload an environment of Functions declares, by ID.
// It is made at its first use, as models is: a process whose tables have
// no expression never builds them.
var bounds = sync.OnceValue(func() map[string]bound {
	m := map[string]bound{}
	add := func(by bounded, why string, ids ...string) {
		for _, id := range ids {
			if _, ok := m[id]; ok {
				panic("exprcost: overload " + id + " listed twice in bounds")
			}
			m[id] = bound{by, why}
		}
	}
	add(scalar, "logic, arithmetic and comparison of bools, numbers, timestamps and durations",
		"logical_not", "negate_double", "negate_int64", "not_strictly_false", "__not_strictly_false__",
		"modulo_int64", "modulo_uint64", "multiply_double", "multiply_int64", "multiply_uint64",
		"add_double", "add_int64", "add_uint64", "add_duration_duration", "add_duration_timestamp", "add_timestamp_duration",
		"subtract_double", "subtract_int64", "subtract_uint64", "subtract_duration_duration", "subtract_timestamp_duration", "subtract_timestamp_timestamp",
		"divide_double", "divide_int64", "divide_uint64",
		"less_bool", "less_int64", "less_int64_double", "less_int64_uint64", "less_uint64", "less_uint64_double", "less_uint64_int64",
		"less_double", "less_double_int64", "less_double_uint64", "less_timestamp", "less_duration",
		"less_equals_bool", "less_equals_int64", "less_equals_int64_double", "less_equals_int64_uint64", "less_equals_uint64",
		"less_equals_uint64_double", "less_equals_uint64_int64", "less_equals_double", "less_equals_double_int64",
		"less_equals_double_uint64", "less_equals_timestamp", "less_equals_duration",
		"greater_bool", "greater_int64", "greater_int64_double", "greater_int64_uint64", "greater_uint64", "greater_uint64_double",
		"greater_uint64_int64", "greater_double", "greater_double_int64", "greater_double_uint64", "greater_timestamp", "greater_duration",
		"greater_equals_bool", "greater_equals_int64", "greater_equals_int64_double", "greater_equals_int64_uint64", "greater_equals_uint64",
		"greater_equals_uint64_double", "greater_equals_uint64_int64", "greater_equals_double", "greater_equals_double_int64",
		"greater_equals_double_uint64", "greater_equals_timestamp", "greater_equals_duration")
	add(scalar, "a conversion between bools, numbers, timestamps and durations",
		"bool_to_bool", "double_to_double", "int64_to_double", "uint64_to_double", "duration_to_duration",
		"int64_to_int64", "double_to_int64", "duration_to_int64", "timestamp_to_int64", "uint64_to_int64",
		"uint64_to_uint64", "double_to_uint64", "int64_to_uint64", "timestamp_to_timestamp", "int64_to_timestamp")
	add(scalar, "a field of a timestamp or a duration, in UTC",
		"timestamp_to_day_of_month_1_based", "timestamp_to_day_of_month", "timestamp_to_day_of_week", "timestamp_to_day_of_year",
		"timestamp_to_year", "timestamp_to_hours", "duration_to_hours", "timestamp_to_milliseconds", "duration_to_milliseconds",
		"timestamp_to_minutes", "duration_to_minutes", "timestamp_to_month", "timestamp_to_seconds", "duration_to_seconds")
	add(scalar, "the size of bytes, a list or a map is their length, kept with them",
		"size_bytes", "bytes_size", "size_list", "list_size", "size_map", "map_size")
	add(scalar, "a value's type", "type")

	add(celgo, "a string's or bytes' concatenation: a tenth a character of both, the result their sum", overloads.AddString, overloads.AddBytes)
	add(celgo, "a list's concatenation is a view of both (1), the result their sum", overloads.AddList)
	add(celgo, "an element or a member found by key: 1, the result an element of the operand (a string key is hashed, at its length: cel-go plans an index as an attribute's qualifier, charged 1, which no model reaches; so Check refuses a computed key in a comprehension's loop, where it would be hashed at each step, and elsewhere it is hashed once, no larger than the event or charged for as it was built)", overloads.IndexList, overloads.IndexMap)
	add(celgo, "a scan of the prefix or suffix", overloads.StartsWithString, overloads.EndsWithString)
	add(celgo, "a scan of the string for each character of the other", overloads.ContainsString)
	add(celgo, "a scan of the shorter string or bytes",
		overloads.LessString, overloads.LessBytes, overloads.LessEqualsString, overloads.LessEqualsBytes,
		overloads.GreaterString, overloads.GreaterBytes, overloads.GreaterEqualsString, overloads.GreaterEqualsBytes)
	add(celgo, "a scan of the bytes; a string of bytes has at most a character a byte", overloads.BytesToString)
	add(modeled, "a scan, and a tenth a byte of the result, which has at most 4 a character: cel-go charges only the scan", overloads.StringToBytes)
	add(modeled, "a scan, and a tenth a character of the result, which has at most 2 a character and the quotes: cel-go charges only the scan", overloads.ExtQuoteString)
	add(celgo, "&&, || and ?: cost what they evaluate; ?: gives one of its branches", overloads.LogicalAnd, overloads.LogicalOr, overloads.Conditional)
	add(celgo, "dyn(x) is x: 1, the size of x", "to_dyn")
	add(celgo, "strings extension: a scan of the receiver (and of the needle, for each character); charAt gives a character",
		"string_char_at_int", "string_index_of_string", "string_index_of_string_int", "string_last_index_of_string", "string_last_index_of_string_int")
	add(celgo, "strings extension: a scan and a character of the result for each character; the result no longer than the receiver",
		"string_lower_ascii", "string_upper_ascii", "string_reverse", "string_trim", "string_substring_int", "string_substring_int_int")
	add(celgo, "strings extension: a unit a character of the result, which is at most the elements' and the separators' characters", "list_join", "list_join_string")
	add(celgo, "strings extension: a scan for each character of the needle, a unit a character of the result, which is at most (receiver+1)×(replacement+1)",
		"string_replace_string_string", "string_replace_string_string_int")
	add(celgo, "strings extension: a scan, and a unit an element of the result, which has at most a part more than the receiver's characters, none longer",
		"string_split_string", "string_split_string_int")

	add(modeled, "a scan: the length of a string is counted, character by character", "size_string", "string_size")
	add(modeled, "a scan: the number, duration or timestamp is parsed (and an error copies the text)",
		"string_to_int64", "string_to_uint64", "string_to_double", "string_to_bool", "string_to_duration", "string_to_timestamp")
	add(modeled, "the value itself: 1, its size", "string_to_string", "bytes_to_bytes")
	add(modeled, "1, and a result of at most as many characters as the type's longest text",
		"bool_to_string", "int64_to_string", "uint64_to_string", "double_to_string", "duration_to_string", "timestamp_to_string")
	add(modeled, "a time zone by name: the name checked, the zone loaded from the time-zone database, a file, unless kept (ours: zone.go): tzCost and a scan of the name", slices.Collect(maps.Keys(inZone))...)
	add(modeled, "a key looked up in a map: a scan of the key, which is hashed", overloads.InMap)
	add(modeled, "partitionFor: a scan of the key (functions.go)", "partition_for_string_int")

	add(manual, "format: a tenth a character of the format and of the result, which is at most the format and what each clause writes of its argument (formatted)", overloads.ExtFormatString)
	add(manual, "a comparison as deep as the shallower operand: a tenth a character and a unit an element of it (deep)", overloads.Equals, overloads.NotEquals)
	add(manual, "RE2's match of a pattern written in the expression (Check), compiled once: a unit for each instruction of its program and each character of the string (regex.go)",
		overloads.Matches, overloads.MatchesString)
	add(manual, "a unit an element of the list and a comparison of each: at most the list's, and the element's times the length, deep size (deep)", overloads.InList)
	return m
})

// tzCost is what a call that names a time zone costs: time.LoadLocation
// reads a zone not yet kept from the time-zone database, a file, and a
// name it has not, from each place it looks in, Go's own zoneinfo.zip
// last (docs/benchmarks.md, "What a cost unit stands for"); a cost unit
// is about 50 ns. A zone kept costs far less, and is charged as much.
const tzCost = 1_500

// models are our cost models (the modeled entries of bounds).
var models = sync.OnceValue(func() []cost.OverloadModel {
	scan := func(q cost.QuantityExpr) cost.QuantityExpr {
		return cost.Sum(cost.Const(cost.CallCost), cost.StringScan(q))
	}
	ms := []cost.OverloadModel{
		cost.Overload("size_string", cost.EvalCost(scan(cost.Length(cost.Arg(0))))),
		cost.MemberOverload("string_size", cost.EvalCost(scan(cost.Length(cost.Target())))),
		cost.Overload("string_to_string", cost.EvalCost(cost.Const(1)), cost.ResultSize(cost.Arg(0))),
		cost.Overload("bytes_to_bytes", cost.EvalCost(cost.Const(1)), cost.ResultSize(cost.Arg(0))),
		cost.Overload(overloads.InMap, cost.EvalCost(scan(cost.Length(cost.Arg(0))))),
		// What they write, a tenth a character (a byte), as a string's
		// concatenation is charged: cel-go charges a tenth of what they
		// read, and they write up to 4 and 2 times that.
		cost.Overload(overloads.StringToBytes, cost.EvalCost(scan(cost.Sum(cost.Length(cost.Arg(0)), cost.Length(cost.Result())))),
			cost.ResultSize(cost.Ranged(cost.Arg(0), cost.Scale(cost.Arg(0), 4)))),
		cost.Overload(overloads.ExtQuoteString, cost.EvalCost(scan(cost.Sum(cost.Length(cost.Arg(0)), cost.Length(cost.Result())))),
			cost.ResultSize(cost.Ranged(cost.Sum(cost.Arg(0), cost.Const(2)), cost.Sum(cost.Scale(cost.Arg(0), 2), cost.Const(2))))),
		partitionForCost,
	}
	for _, id := range []string{"string_to_int64", "string_to_uint64", "string_to_double", "string_to_bool", "string_to_duration", "string_to_timestamp"} {
		ms = append(ms, cost.Overload(id, cost.EvalCost(scan(cost.Length(cost.Arg(0))))))
	}
	// The longest text of each: "-9223372036854775808", "false",
	// "-1.7976931348623157e+308" (%g), "-315576000000.999999999s", and
	// RFC 3339 of a year past 9999 (Postgres has them to 294276) with
	// nanoseconds and an offset: all under the bounds given.
	for id, longest := range map[string]uint64{"bool_to_string": 5, "int64_to_string": 20, "uint64_to_string": 20,
		"double_to_string": 32, "duration_to_string": 32, "timestamp_to_string": 64} {
		ms = append(ms, cost.Overload(id, cost.EvalCost(cost.Const(1)), cost.ResultSize(cost.AtMost(cost.Const(longest)))))
	}
	for id := range inZone {
		ms = append(ms, cost.MemberOverload(id, cost.EvalCost(cost.Sum(cost.Const(tzCost), cost.StringScan(cost.Length(cost.Arg(0)))))))
	}
	slices.SortFunc(ms, func(a, b cost.OverloadModel) int { return strings.Compare(a.ID, b.ID) })
	return ms
})

// tenth is cel-go's scan of n characters: a tenth of a unit each, rounded
// up, and unbounded for an unbounded n.
func tenth(n uint64) uint64 {
	if n == math.MaxUint64 {
		return n
	}
	return n/10 + min(n%10, 1)
}

// Estimator gives cel-go's checker the size of what an event holds, and
// the estimates of the manual entries of bounds: with it, the checker's
// estimate of an expression's cost on an event of its size bounds what a
// counted evaluation of it is charged on any event no larger.
//
// Every string, list and map read from a variable (a node with a path) is
// at most the event's size, and so are their elements, three levels deep
// (deeper, cel-go takes them as unbounded, and the estimate has no bound).
// What an expression computes has the size its functions' models give it,
// and none if they give none: unbounded (not the event's: three nested
// formats write a thousand times the event).
type Estimator struct {
	size      uint64
	checked   *ast.AST
	variables map[string]bool
}

var _ checker.CostEstimator = Estimator{}

// NewEstimator is the Estimator of a, a checked expression whose variables
// are the event's (by name: the format estimate tells a value read from one
// in a list literal), on an event of size bytes. No string, list or map
// read from the event is larger than size, in bytes or elements, and size
// is at least 64 bytes more than the event's values together (formatRatio
// counts on both).
func NewEstimator(a *cel.Ast, variables map[string]bool, size uint64) Estimator {
	return Estimator{size: size, checked: a.NativeRep(), variables: variables}
}

// EstimateSize is at most the event's size for what is read from the
// event, fewer than four lists or maps deep; nil (cel-go's own size, or
// none) for anything else.
func (e Estimator) EstimateSize(n cost.AstNode) *cost.SizeEstimate {
	if n.ComputedSize() != nil || !e.read(n) {
		return nil // a literal, what cel-go works out from operands, or nothing known
	}
	hints := 0
	for _, p := range n.Path() {
		if strings.HasPrefix(p, "@") {
			hints++
		}
	}
	if hints > 3 {
		return nil
	}
	return &cost.SizeEstimate{Min: 0, Max: e.size}
}

// The estimates of the manual entries. A value read from the event (a
// node with a path: a variable, or what is selected from one, or an
// element of one) is no larger than the event, whatever the measure: its
// characters, its elements, how deep it is, what format writes of it
// (below). Of a value computed, the estimate knows only the size cel-go
// gives it and its type.

// EstimateCallCost estimates format, the comparisons and in, which cel-go
// models as scans of the operands' top level only, or not at all, and
// matches(), which it models by the pattern's length.
func (e Estimator) EstimateCallCost(_, id string, target *cost.AstNode, args []cost.AstNode) *cost.CallEstimate {
	switch {
	case id == overloads.ExtFormatString && target != nil && len(args) == 1:
		return e.format(*target, args[0])
	case id == overloads.MatchesString && target != nil && len(args) == 1:
		return e.estimateMatch(*target, args[0])
	case id == overloads.Matches && target == nil && len(args) == 2:
		return e.estimateMatch(args[0], args[1])
	case (id == overloads.Equals || id == overloads.NotEquals) && len(args) == 2:
		c := max(1, tenth(min(e.deep(args[0]), e.deep(args[1]))))
		return cost.NewCallEstimate(cost.CostEstimate{Min: 1, Max: c}, nil)
	case id == overloads.InList && len(args) == 2:
		n := cost.EstimateSize(e, args[1]).Max
		c := max(1, cost.SafeAdd(n, tenth(min(cost.SafeMultiply(n, e.deep(args[0])), e.deep(args[1])))))
		return cost.NewCallEstimate(cost.CostEstimate{Min: 1, Max: c}, nil)
	}
	return nil
}

// deep is the estimate of how deep n's value is: a character of a string
// or a byte of bytes is 1, and so is an element of a list (and each of its
// elements' own deep size), a member of a map (and its key's and value's),
// and any other value. Comparing two values for equality takes at most as
// long as the shallower one is deep; cel-go's models take a list or a map
// as its length, and ["x"] == ["x"] of two 1 MB strings cost 1.
func (e Estimator) deep(n cost.AstNode) uint64 {
	if t := n.Type(); fixedSize(t) {
		return 1
	}
	switch n.Type().Kind() {
	case types.StringKind, types.BytesKind:
		return cost.EstimateSize(e, n).Max
	}
	if e.read(n) {
		return e.size
	}
	if sz := n.ComputedSize(); sz != nil {
		return deepOf(*sz, n.Type())
	}
	return math.MaxUint64
}

// read reports whether n is a value read from the event: cel-go gives it a
// path from one of the variables.
func (e Estimator) read(n cost.AstNode) bool { return len(n.Path()) > 0 }

// deepOf bounds the deep size of a value of type t and size sz: a list's
// elements and a map's keys and values by their own estimates. A dyn's
// shape is unknown, and so it is unbounded.
func deepOf(sz cost.SizeEstimate, t *types.Type) uint64 {
	switch {
	case fixedSize(t):
		return 1
	case t.Kind() == types.StringKind || t.Kind() == types.BytesKind:
		return sz.Max
	case sz.Max == 0:
		return 0
	case t.Kind() == types.ListKind:
		return cost.SafeMultiply(sz.Max, cost.SafeAdd(1, part(sz.Elem, param(t, 0))))
	case t.Kind() == types.MapKind:
		return cost.SafeMultiply(sz.Max, cost.SafeAdd(1, part(sz.Key, param(t, 0)), part(sz.Elem, param(t, 1))))
	}
	return math.MaxUint64
}

// param is t's i-th type parameter (a list's element, a map's key and
// value), or dyn.
func param(t *types.Type, i int) *types.Type {
	if ps := t.Parameters(); i < len(ps) {
		return ps[i]
	}
	return types.DynType
}

func part(sz *cost.SizeEstimate, t *types.Type) uint64 {
	if fixedSize(t) {
		return 1
	}
	if sz == nil {
		return math.MaxUint64
	}
	return deepOf(*sz, t)
}

// fixedSize reports whether every value of t has size 1 to cel-go, and is
// 1 deep: a bool, a number, a timestamp, a duration, null, a type.
func fixedSize(t *types.Type) bool {
	switch t.Kind() {
	case types.BoolKind, types.IntKind, types.UintKind, types.DoubleKind, types.TimestampKind, types.DurationKind, types.NullTypeKind, types.TypeKind:
		return true
	}
	return false
}

// The most characters format writes for one clause of a value that is not
// a string, bytes, a list or a map: %f and %e take a precision up to 100
// (the strings extension's limit from version 5), and %.100f of -1e308 is
// 411 characters; %s of a double (-5e-324 written out) 327, %b of an int
// 65, a timestamp at most 64 (timestamp_to_string).
const formattedScalar = 411

// formatRatio bounds what format writes of a value read from the event, in
// characters, per byte of the event: %s writes a string's characters and
// a number's digits, and "1e308", 5 bytes, is 309 digits (a ratio under
// 62, and the event has at least 64 bytes more than its values); %x writes
// 2 hex digits a byte, and a string read from JSON has at most 3 bytes
// (U+FFFD) for each byte of it.
const formatRatio = 64

// format estimates s.format(list): the format's characters (a "%%"
// writes one of its two) and, for each clause, what it writes of its
// argument; the arguments past the clauses are not read. A literal format
// says which clause each argument gets; any other has at most one clause
// for every two of its characters, each of any kind.
func (e Estimator) format(target, list cost.AstNode) *cost.CallEstimate {
	t := cost.EstimateSize(e, target).Max
	var verbs []byte // the clauses of a literal format, in order
	most := t / 2    // the clauses
	if lit, ok := literalString(target); ok {
		verbs, _, _ = clauses(lit) // none, for one the strings extension refuses: it writes nothing
		most = uint64(len(verbs))
	}
	out := t
	if l := list.Expr(); l.Kind() == ast.ListKind {
		sizes := cost.EstimateSize(e, list)
		for i, el := range l.AsList().Elements() {
			if uint64(i) >= most {
				break
			}
			out = cost.SafeAdd(out, e.formatted(el, sizes.Elem, verb(verbs, i)))
		}
	} else {
		sizes := cost.EstimateSize(e, list)
		n := min(sizes.Max, most)
		switch {
		case e.read(list):
			// Every element is read from the event: together, they
			// are no larger than it.
			out = cost.SafeAdd(out, cost.SafeMultiply(formatRatio, e.size), cost.SafeMultiply(n, formattedScalar))
		case sizes.Elem != nil && list.Type().Kind() == types.ListKind:
			out = cost.SafeAdd(out, cost.SafeMultiply(n, formattedOf(*sizes.Elem, param(list.Type(), 0), 0)))
		default:
			out = math.MaxUint64
		}
	}
	c := cost.SafeAdd(cost.CallCost, tenth(t), tenth(out))
	return cost.NewCallEstimate(cost.CostEstimate{Min: 1, Max: c}, &cost.SizeEstimate{Min: 0, Max: out})
}

// formatted bounds what one clause (verb, or 0 for any) writes of el, an
// element of a list literal whose elements are each of size elem at most.
func (e Estimator) formatted(el ast.Expr, elem *cost.SizeEstimate, verb byte) uint64 {
	if rootedAtVariable(el, e.variables) {
		return cost.SafeAdd(cost.SafeMultiply(formatRatio, e.size), formattedScalar)
	}
	// A literal written in the expression, and what a list or map
	// written so holds, each element bounded as elem's own elements are.
	switch el.Kind() {
	case ast.LiteralKind:
		switch lit := el.AsLiteral().(type) {
		case types.String:
			return formattedOf(cost.FixedSizeEstimate(uint64(utf8.RuneCountInString(string(lit)))), types.StringType, verb)
		case types.Bytes:
			return formattedOf(cost.FixedSizeEstimate(uint64(len(lit))), types.BytesType, verb)
		}
	case ast.ListKind:
		var sub *cost.SizeEstimate
		if elem != nil {
			sub = elem.Elem
		}
		n := uint64(2)
		for _, x := range el.AsList().Elements() {
			n = cost.SafeAdd(n, 2, e.formatted(x, sub, 's'))
		}
		return n
	case ast.MapKind:
		var keys, values *cost.SizeEstimate
		if elem != nil {
			keys, values = elem.Key, elem.Elem
		}
		n := uint64(2)
		for _, x := range el.AsMap().Entries() {
			entry := x.AsMapEntry()
			n = cost.SafeAdd(n, 4, e.formatted(entry.Key(), keys, 's'), e.formatted(entry.Value(), values, 's'))
		}
		return n
	}
	t := e.checked.GetType(el.ID())
	if elem == nil {
		if fixedSize(t) {
			return formattedScalar
		}
		return math.MaxUint64
	}
	return formattedOf(*elem, t, verb)
}

// formattedOf bounds what a clause (verb, or 0 for any) writes of a value
// of type t and size sz: a string's characters (%x: 2 hex digits for each
// of its bytes, at most 4 a character), bytes' bytes, a list's elements
// between "[" and "]" with ", " between them, a map's "key: value"s
// between braces.
func formattedOf(sz cost.SizeEstimate, t *types.Type, verb byte) uint64 {
	switch t.Kind() {
	case types.StringKind:
		if verb == 's' {
			return sz.Max
		}
		return cost.SafeMultiply(sz.Max, 8)
	case types.BytesKind:
		if verb == 's' {
			return sz.Max
		}
		return cost.SafeMultiply(sz.Max, 2)
	case types.ListKind:
		if sz.Elem == nil {
			return math.MaxUint64
		}
		return cost.SafeAdd(2, cost.SafeMultiply(sz.Max, cost.SafeAdd(2, formattedOf(*sz.Elem, param(t, 0), 's'))))
	case types.MapKind:
		if sz.Elem == nil || sz.Key == nil {
			return math.MaxUint64
		}
		return cost.SafeAdd(2, cost.SafeMultiply(sz.Max, cost.SafeAdd(4, formattedOf(*sz.Key, param(t, 0), 's'), formattedOf(*sz.Elem, param(t, 1), 's'))))
	}
	if fixedSize(t) {
		return formattedScalar
	}
	return math.MaxUint64
}

func verb(verbs []byte, i int) byte {
	if i < len(verbs) {
		return verbs[i]
	}
	return 0
}

func literalString(n cost.AstNode) (string, bool) {
	if x := n.Expr(); x != nil && x.Kind() == ast.LiteralKind {
		s, ok := x.AsLiteral().(types.String)
		return string(s), ok
	}
	return "", false
}

// rootedAtVariable reports whether x is one of the variables, or what a
// selection or an index takes out of one: a value read from the event.
func rootedAtVariable(x ast.Expr, variables map[string]bool) bool {
	for {
		switch x.Kind() {
		case ast.IdentKind:
			return variables[x.AsIdent()]
		case ast.SelectKind:
			if x.AsSelect().IsTestOnly() {
				return false
			}
			x = x.AsSelect().Operand()
		case ast.CallKind:
			call := x.AsCall()
			if call.FunctionName() != "_[_]" || len(call.Args()) != 2 {
				return false
			}
			x = call.Args()[0]
		default:
			return false
		}
	}
}

// tracker charges each call at run time. It charges the manual entries of
// bounds as their estimates have them, and a call cel-go dispatches only
// at run time (an operand of type dyn, as the event's are: payload.a +
// payload.b may be ints, strings or lists), which cel-go charges 1
// whatever it does, as the overload the operands select; what it does not
// charge, cel-go does.
type tracker struct {
	overloads map[string][]*decls.OverloadDecl // each function's, by its name
	charges   map[string]cost.FunctionTracker  // ours and cel-go's standard library's, by overload ID
}

var _ cost.ActualCostEstimator = (*tracker)(nil)

func newTracker(env *cel.Env) *tracker {
	t := &tracker{overloads: map[string][]*decls.OverloadDecl{}, charges: cost.StandardOverloadTrackers()}
	for name, f := range env.Functions() {
		t.overloads[name] = f.OverloadDecls()
	}
	for _, m := range models() {
		t.charges[m.ID] = m.FunctionTracker()
	}
	return t
}

func (t *tracker) CallCost(function, id string, args []ref.Val, result ref.Val) *uint64 {
	if id != "" {
		return t.charge(id, args, result)
	}
	var most *uint64
	for _, o := range t.overloads[function] {
		if !accepts(o, args) {
			continue
		}
		if c := t.charge(o.ID(), args, result); c != nil && (most == nil || *c > *most) {
			most = c
		}
	}
	return most
}

// accepts reports whether o's signature takes args (a member function's
// receiver first), as cel-go's dispatch checks it.
func accepts(o *decls.OverloadDecl, args []ref.Val) bool {
	params := o.ArgTypes()
	if len(params) != len(args) {
		return false
	}
	for i, p := range params {
		if !p.IsAssignableRuntimeType(args[i]) {
			return false
		}
	}
	return true
}

func (t *tracker) charge(id string, args []ref.Val, result ref.Val) *uint64 {
	var c uint64
	switch {
	case id == overloads.ExtFormatString && len(args) == 2:
		c = cost.SafeAdd(cost.CallCost, tenth(characters(args[0])), tenth(characters(result)))
	case (id == overloads.Equals || id == overloads.NotEquals) && len(args) == 2:
		c = max(1, tenth(deepMin(args[0], 1, args[1])))
	case id == overloads.InList && len(args) == 2:
		n := cost.ActualSize(args[1])
		c = max(1, cost.SafeAdd(n, tenth(deepMin(args[0], n, args[1]))))
	case id == overloads.Matches || id == overloads.MatchesString:
		c = chargeMatch(args)
	default:
		if f, ok := t.charges[id]; ok {
			return f(args, result)
		}
		return nil
	}
	return &c
}

func characters(v ref.Val) uint64 {
	if s, ok := v.(types.String); ok {
		return uint64(utf8.RuneCountInString(string(s)))
	}
	return 0
}

// deepMin is the lesser of n times a's deep size and b's (Estimator.deep
// says what it is). It sizes both up to a limit that it raises eightfold
// until one fits, so that sizing them costs about what the lesser does,
// not what the larger does: the charge of "x" == payload, or of a large
// string in a short list, must not take longer than the comparison.
func deepMin(a ref.Val, n uint64, b ref.Val) uint64 {
	for limit := uint64(64); ; limit = cost.SafeMultiply(limit, 8) {
		da, okA := deepUpTo(a, limit/max(n, 1))
		db, okB := deepUpTo(b, limit)
		switch {
		case okA && okB:
			return min(cost.SafeMultiply(n, da), db)
		case okA:
			return cost.SafeMultiply(n, da)
		case okB:
			return db
		case limit == math.MaxUint64:
			return limit
		}
	}
}

// deepUpTo is v's deep size if it is at most limit; false, once the walk
// finds it more, and stops.
func deepUpTo(v ref.Val, limit uint64) (uint64, bool) {
	var size uint64
	ok := deep(v, &size, limit)
	return size, ok
}

func deep(v ref.Val, size *uint64, limit uint64) bool {
	add := func(n uint64) bool {
		*size = cost.SafeAdd(*size, n)
		return *size <= limit
	}
	switch v := v.(type) {
	case types.String:
		// A character is 1 to 4 bytes: past 4 bytes a unit of the limit
		// left, it is over without counting.
		if uint64(len(v)) > cost.SafeMultiply(4, limit-*size) {
			return add(uint64(len(v)))
		}
		return add(uint64(utf8.RuneCountInString(string(v))))
	case types.Bytes:
		return add(uint64(len(v)))
	case traits.Mapper:
		for it := v.Iterator(); it.HasNext() == types.True; {
			k := it.Next()
			if !add(1) || !deep(k, size, limit) || !deep(v.Get(k), size, limit) {
				return false
			}
		}
		return true
	case traits.Lister:
		for it := v.Iterator(); it.HasNext() == types.True; {
			if !add(1) || !deep(it.Next(), size, limit) {
				return false
			}
		}
		return true
	}
	return add(1)
}
