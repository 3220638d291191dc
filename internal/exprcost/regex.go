package exprcost

import (
	"errors"
	"fmt"
	"math"
	"regexp"
	"regexp/syntax"
	"sync"
	"sync/atomic"

	"cel.dev/cel-go/cel"
	"cel.dev/cel-go/common/cost"
	"cel.dev/cel-go/common/functions"
	"cel.dev/cel-go/common/overloads"
	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"
	"cel.dev/cel-go/common/types/traits"
	"cel.dev/cel-go/interpreter"
)

// matches() takes a pattern written in the expression (Check), compiled
// once, when the program is planned, and of a known size. A pattern the
// event gave would be compiled at each call, to what its repeats make of
// it, not its length ("(?:|a){1000}", 12 characters, is 3,002
// instructions): the event would choose what its own filter costs.
//
// RE2 (Go's regexp) steps through each instruction of the program at most
// once for each character and at the end, whichever matcher runs: a match
// is charged a unit an instruction a character and at the end (a step of
// its NFA through a Unicode class), and 2 more an instruction for the
// state it allocates for the program where it has none pooled
// (docs/benchmarks.md, "What a cost unit stands for").

// errPatternNotLiteral is matches() with a pattern that is not a literal.
var errPatternNotLiteral = errors.New("matches() takes a pattern written in the expression (a string literal), not one computed or read from the event: a pattern is compiled once, at start, and its cost is known only then")

// programs are the patterns' sizes, for the tracker at run time: at most
// 4096 of them are kept (a pattern is an expression's).
var programs, programsKept = sync.Map{}, atomic.Int64{}

// programSize is how many instructions pattern compiles to, as
// regexp.Compile compiles it, or why it does not compile.
func programSize(pattern string) (uint64, error) {
	if n, ok := programs.Load(pattern); ok {
		return n.(uint64), nil
	}
	re, err := syntax.Parse(pattern, syntax.Perl)
	var prog *syntax.Prog
	if err == nil {
		prog, err = syntax.Compile(re.Simplify())
	}
	if err != nil {
		return 0, fmt.Errorf("matches(): its pattern does not compile: %w", err)
	}
	n := uint64(len(prog.Inst))
	if programsKept.Add(1) <= 4096 {
		programs.Store(pattern, n)
	}
	return n, nil
}

// matchCost is a match's charge: the call, and, for each instruction, a
// unit a character and 3 (the end, and the state).
func matchCost(size, chars uint64) uint64 {
	return cost.SafeAdd(cost.CallCost, cost.SafeMultiply(size, cost.SafeAdd(chars, 3)))
}

// estimateMatch is matchCost on the most characters s may have: no bound
// for a pattern that is not a literal (Check refuses it) or compiles not.
func (e Estimator) estimateMatch(s, pattern cost.AstNode) *cost.CallEstimate {
	c := uint64(math.MaxUint64)
	if p, ok := literalString(pattern); ok {
		if size, err := programSize(p); err == nil {
			c = matchCost(size, cost.EstimateSize(e, s).Max)
		}
	}
	return cost.NewCallEstimate(cost.CostEstimate{Min: 1, Max: c}, nil)
}

// chargeMatch is matchCost on the string's characters; a call, for
// operands of other types (no such overload).
func chargeMatch(args []ref.Val) uint64 {
	s, ok1 := stringArg(args, 0)
	p, ok2 := stringArg(args, 1)
	size, err := programSize(p)
	if !ok1 || !ok2 || err != nil {
		return cost.CallCost
	}
	return matchCost(size, chars(s))
}

// precompiled is the matches() call checked, with its pattern compiled:
// cel-go's binding (String.Match) but the compilation at each call.
func precompiled(call interpreter.InterpretableCall) (*checked, error) {
	pattern, ok := call.Args()[len(call.Args())-1].(interpreter.InterpretableConst)
	if !ok {
		return nil, errPatternNotLiteral
	}
	p, _ := pattern.Value().(types.String)
	re, err := regexp.Compile(string(p))
	if err != nil {
		return nil, fmt.Errorf("matches(): its pattern does not compile: %w", err)
	}
	return &checked{call, &functions.Overload{Operator: overloads.Matches, OperandTrait: traits.MatcherType, Binary: func(s, _ ref.Val) ref.Val {
		if str, ok := s.(types.String); ok {
			return types.Bool(re.MatchString(string(str)))
		}
		return types.MaybeNoSuchOverloadErr(s)
	}}}, nil
}

// Uncounted is what plans a program that does not count its cost as a
// Counted one is: matches() with its pattern compiled once (cel-go's).
func Uncounted() []cel.ProgramOption {
	return []cel.ProgramOption{cel.OptimizeRegex(interpreter.MatchesRegexOptimization)}
}
