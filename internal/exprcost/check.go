package exprcost

import (
	"cel.dev/cel-go/common/ast"
	"cel.dev/cel-go/common/operators"
	"cel.dev/cel-go/common/overloads"
	"cel.dev/cel-go/common/types"
)

// What no estimate bounds, Check refuses:
//   - matches() with a pattern that is not a literal, or does not compile
//     (regex.go);
//   - inside a comprehension's loop (all's predicate, map's function...),
//     an index or a map literal whose key is computed and may be a string
//     (m[x], {payload.k: 1}): a map hashes a string key at its length, and
//     cel-go charges an index's qualifier or a map literal 1, where no
//     model reaches, so a long key hashed at each step of a long loop runs
//     for seconds charged nothing (docs/benchmarks.md). Outside a loop, a
//     node runs at most once: its key is hashed once, either read from the
//     event (no larger than it) or charged for as it was built. (Charged
//     at each step, as `k in m` is, most would be refused on the estimate.)

// A Refusal is what Check refuses: the node at fault, and why.
type Refusal struct {
	ID  int64
	Why string
}

func (r *Refusal) Error() string { return r.Why }

// Check is nil for a checked expression whose every call an estimate
// bounds, and the first Refusal otherwise.
func Check(a *ast.AST) error {
	root := ast.NavigateAST(a)
	for _, n := range ast.MatchDescendants(root, ast.FunctionMatcher(overloads.Matches)) {
		call := n.AsCall()
		pattern := call.Args()[len(call.Args())-1]
		if pattern.Kind() != ast.LiteralKind {
			return &Refusal{pattern.ID(), errPatternNotLiteral.Error()}
		}
		if p, ok := pattern.AsLiteral().(types.String); ok {
			if _, err := programSize(string(p)); err != nil {
				return &Refusal{pattern.ID(), err.Error()}
			}
		}
	}
	for _, c := range ast.MatchDescendants(root, ast.KindMatcher(ast.ComprehensionKind)) {
		comp := c.AsComprehension()
		for _, loop := range []ast.Expr{comp.LoopCondition(), comp.LoopStep()} {
			if id, ok := computedKey(a, loop); ok {
				return &Refusal{id, "an index or a map literal with a key computed from the event, inside a comprehension (all, exists, exists_one, map, filter): " +
					`the key is hashed at each step, and no cost count reaches that; index by a key written in the expression (m["name"]), or ask whether a computed key is there with "k in m", which is counted`}
			}
		}
	}
	return nil
}

// computedKey is the node, in x, of an index or a map literal entry whose
// key is not a literal and may be a string.
func computedKey(a *ast.AST, x ast.Expr) (int64, bool) {
	mayHash := func(key ast.Expr) bool {
		return key.Kind() != ast.LiteralKind && !fixedSize(a.GetType(key.ID()))
	}
	for _, n := range ast.MatchDescendants(ast.NavigateExpr(a, x), ast.AllMatcher()) {
		switch n.Kind() {
		case ast.CallKind:
			call := n.AsCall()
			if call.FunctionName() == operators.Index && mayHash(call.Args()[1]) {
				return call.Args()[1].ID(), true
			}
		case ast.MapKind:
			for _, e := range n.AsMap().Entries() {
				if key := e.AsMapEntry().Key(); mayHash(key) {
					return key.ID(), true
				}
			}
		}
	}
	return 0, false
}
