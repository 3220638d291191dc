package expr

import (
	"errors"
	"strings"
	"testing"

	"cel.dev/cel-go/cel"

	"github.com/outboxcdc/cdc/internal/exprcost"
)

// TestWhatAnEvaluationBuildsIsCounted: an expression that builds far more
// than its event, or works far longer than its count says, is refused at
// Compile or stopped at CostLimit. Each of these passed both bounds before
// exprcost's bounds.go: the formats' output was taken as no larger than
// the event, and a call on dyn operands, or a comparison of lists, was
// counted as 1.
func TestWhatAnEvaluationBuildsIsCounted(t *testing.T) {
	e := newEnv(t)
	tens := func(depth int) string { // formats of formats, ten-way: 10^depth times payload.s
		x := "payload.s"
		for range depth {
			x = `"` + strings.Repeat("%s", 10) + `".format([` + strings.TrimSuffix(strings.Repeat(x+", ", 10), ", ") + `])`
		}
		return x
	}
	fifty := "[" + strings.TrimSuffix(strings.Repeat("0, ", 50), ", ") + "]"
	big := strings.Repeat("x", 6<<20)
	for _, tc := range []struct {
		name, text string
		s          string // payload.s, .a, .b; .x and .y are [s]
		want       string // "refused": Compile refuses it; "cost": ErrCost; "ok"
		chars      int    // for ok: the result's length
	}{
		// A 14 KB expression that wrote 100 MB on a 100 KB event in 0.66 s,
		// estimated at 3,332 and counted on no event up to 1 GiB.
		{"nested formats", tens(3), strings.Repeat("x", 100_000), "refused", 0},
		{"a format", tens(1), strings.Repeat("x", 100_000), "ok", 1_000_000},
		{"a format of a larger event", tens(1), strings.Repeat("x", 1_000_000), "cost", 0},
		{"+ of dyn strings", "payload.a + payload.b", big, "cost", 0},
		{"size of a dyn string, again and again", fifty + ".all(i, size(payload.s) > 0)", big, "cost", 0},
		{"lists of a string compared, again and again", fifty + ".all(i, payload.x == payload.y)", big, "cost", 0},
		{"a string in a list, again and again", fifty + ".all(i, payload.s in payload.x)", big, "cost", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := WantString
			if strings.HasPrefix(tc.text, "[") {
				want = WantBool
			}
			p, err := e.Compile(tc.text, want)
			if tc.want == "refused" {
				if err == nil || !strings.Contains(err.Error(), "its estimated cost") {
					t.Fatalf("Compile: %v; want it refused on its estimated cost", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			payload := map[string]any{"s": tc.s, "a": tc.s, "b": tc.s, "x": []any{tc.s}, "y": []any{tc.s}}
			size := 64 + 5*len(tc.s) + 100
			var got string
			switch {
			case strings.HasPrefix(tc.text, "["):
				var ok bool
				ok, err = p.Bool(vars(t, map[string]any{Payload: payload}), size)
				got = map[bool]string{true: "true"}[ok]
			default:
				got, _, err = p.String(vars(t, map[string]any{Payload: payload}), size)
			}
			switch tc.want {
			case "cost":
				if !errors.Is(err, ErrCost) {
					t.Fatalf("gave %d characters, %v; want ErrCost", len(got), err)
				}
			case "ok":
				if err != nil || len(got) != tc.chars {
					t.Fatalf("gave %d characters, %v; want %d", len(got), err, tc.chars)
				}
			}
		})
	}
}

// TestFunctionsAreExprcosts: NewEnv declares no function but CEL's
// standard library and exprcost.Functions, every overload of which
// exprcost bounds (its TestEveryFunctionIsBounded): a function declared
// here instead would be bounded by nothing.
func TestFunctionsAreExprcosts(t *testing.T) {
	bounded, err := cel.NewEnv(exprcost.Functions()...)
	if err != nil {
		t.Fatal(err)
	}
	overloads := func(env *cel.Env) map[string]bool {
		ids := map[string]bool{}
		for _, f := range env.Functions() {
			for _, o := range f.OverloadDecls() {
				ids[o.ID()] = true
			}
		}
		return ids
	}
	got, want := overloads(newEnv(t).cel), overloads(bounded)
	if len(want) < 100 {
		t.Fatalf("exprcost.Functions declares %d overloads: too few to be CEL's library and more", len(want))
	}
	for id := range got {
		if !want[id] {
			t.Errorf("NewEnv declares %s, which exprcost.Functions does not: declare it there, with its bound", id)
		}
	}
	for id := range want {
		if !got[id] {
			t.Errorf("NewEnv does not declare %s, which exprcost.Functions does", id)
		}
	}
}
