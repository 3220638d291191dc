package exprcost

import (
	"slices"
	"sort"
	"strings"
	"testing"

	"cel.dev/cel-go/common/cost"
	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"
)

// TestEveryFunctionIsBounded: every overload of every function an
// environment of Functions declares (expr's NewEnv declares no other: its
// TestFunctionsAreExprcosts) is in bounds, as what its kind of bound
// requires: a function that a newer cel-go, or an option, adds fails here
// until it has a bound.
func TestEveryFunctionIsBounded(t *testing.T) {
	e := newEnv(t)
	ours := map[string]bool{}
	for _, m := range models() {
		if b := bounds()[m.ID]; b.by != modeled {
			t.Errorf("model %s: bounds does not say it is modeled", m.ID)
		}
		ours[m.ID] = true
	}
	standard := cost.StandardOverloadEstimators()
	declared := map[string]bool{}
	var names []string
	for name := range e.cel.Functions() {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		arity := map[int]int{}
		for _, o := range e.cel.Functions()[name].OverloadDecls() {
			arity[len(o.ArgTypes())]++
		}
		for _, o := range e.cel.Functions()[name].OverloadDecls() {
			id := o.ID()
			declared[id] = true
			b, ok := bounds()[id]
			if !ok {
				t.Errorf("%s: overload %s has no bound: give it one in bounds.go (a model of its cost and of its result's size), or leave it out of Functions", name, id)
				continue
			}
			switch b.by {
			case scalar:
				if !fixedSize(o.ResultType()) {
					t.Errorf("%s: overload %s gives %s, which is not of fixed size: it needs a model", name, id, o.ResultType())
				}
			case modeled:
				if !ours[id] {
					t.Errorf("%s: overload %s is modeled, and models has none", name, id)
				}
			case celgo:
				// The strings extension's models are pinned with it
				// (ext.StringsVersion(5)); the standard library's are
				// cel-go's table.
				if _, ok := standard[id]; !ok && !strings.HasPrefix(id, "string_") && !strings.HasPrefix(id, "list_join") && id != "to_dyn" {
					t.Errorf("%s: overload %s is cel-go's, and cel-go has no model of it", name, id)
				}
				// cel-go's dispatch at run time, between overloads of
				// one arity, charges the one the values select from the
				// tracker's table; a strings extension's model is not in
				// it.
				if _, ok := e.tracker.charges[id]; arity[len(o.ArgTypes())] > 1 && !ok {
					t.Errorf("%s: overload %s may be selected at run time, and the tracker cannot charge it", name, id)
				}
			case manual:
				if e.tracker.charge(id, manualArgs(id), types.String("")) == nil {
					t.Errorf("%s: overload %s is manual, and the tracker does not charge it", name, id)
				}
			}
		}
	}
	for id := range bounds() {
		if !declared[id] {
			t.Errorf("bounds lists %s, which Functions does not declare", id)
		}
	}
}

// manualArgs are arguments the manual overloads take.
func manualArgs(id string) []ref.Val {
	if id == "string_format" {
		return []ref.Val{types.String("%s"), types.NewStringList(types.DefaultTypeAdapter, []string{"x"})}
	}
	return []ref.Val{types.String("x"), types.NewStringList(types.DefaultTypeAdapter, []string{"x"})}
}

// TestManualEstimates: the estimates of format, of the comparisons and of
// matches bound what the tracker charges, and what format writes, as
// bounds has them.
func TestManualEstimates(t *testing.T) {
	e := newEnv(t)
	// Besides the call: 2 for payload.s (the variable and the member), 10
	// for a list literal; a literal costs nothing.
	for _, tc := range []struct {
		text string
		cost uint64 // on an event of assumedSize
	}{
		// The call, the format's scan, and a tenth of what it writes: the
		// format's characters and, of a value read from the event,
		// formatRatio a byte of the event and a number's longest text.
		{`"a.%s.b".format([payload.s])`, 2 + 10 + 1 + tenth(7) + tenth(7+formatRatio*assumedSize+formattedScalar)},
		// Of a value computed: an int's longest text, a string's own
		// characters for %s, 8 a character for %x (2 hex digits a byte).
		{`"%d-%s".format([1, "xy"])`, 10 + 1 + tenth(5) + tenth(5+formattedScalar+2)},
		{`"%x".format(["xy"])`, 10 + 1 + tenth(2) + tenth(2+2*8)},
		// A list or map written in the expression: its brackets and
		// separators (2, and 2 an element, 4 an entry) and what each
		// element writes.
		{`"%s %s".format([["ab", 7], {"k": b"xy"}])`, 10 + 10 + 30 + 1 + tenth(5) + tenth(5+(2+2+2+2+formattedScalar)+(2+4+1+2))},
		// A list read from the event: its elements, together, are no
		// larger than it; one clause for the two characters.
		{`"%s".format(payload.l)`, 2 + 1 + tenth(2) + tenth(2+formatRatio*assumedSize+1*formattedScalar)},
		// A tenth of the shallower operand's deep size: a string read
		// from the event is assumedSize; ["ab", "c"] is 2 elements of at
		// most 2 characters, 6.
		{`payload.s == payload.t`, 2 + 2 + tenth(assumedSize)},
		{`payload.s == ["ab", "c"]`, 2 + 10 + tenth(2*(1+2))},
		// The list's length and a tenth of its deep size.
		{`payload.s in ["ab", "c"]`, 2 + 10 + 2 + tenth(2*(1+2))},
		// A match: a unit for each instruction of the pattern's program
		// (6 for ^[a-z]+$: fail, the two anchors, the class, the loop, the
		// match) for each character of the string, and 3 more.
		{`payload.s.matches("^[a-z]+$")`, 2 + 1 + 6*(assumedSize+3)},
		{`matches("abc", "^[a-z]+$")`, 1 + 6*(3+3)},
	} {
		a, iss := e.cel.Compile(tc.text)
		if iss.Err() != nil {
			t.Fatal(iss.Err())
		}
		est, err := e.estimate(a, assumedSize)
		if err != nil || est.Max != tc.cost {
			t.Errorf("%s: estimated %d, %v; want %d", tc.text, est.Max, err, tc.cost)
		}
	}
	if got, _, ok := clauses("%s %% %.3f %d"); !ok || !slices.Equal(got, []byte("sfd")) {
		t.Errorf("clauses: %q, %v", got, ok)
	}
}
