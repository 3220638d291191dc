package exprcost

import (
	"runtime"
	"strings"
	"testing"

	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"
	"cel.dev/cel-go/interpreter"
)

// TestNoCallRunsPastTheLimit: a call that would take an evaluation past
// its limit does not run: the evaluation stops before it, at the limit,
// instead of doing it and being charged afterwards (a split or a replace
// of a 2 MB string built tens of megabytes first; a match of a 400 KB
// string against a pattern of 53 instructions runs for a second).
func TestNoCallRunsPastTheLimit(t *testing.T) {
	e := newEnv(t)
	doubles := make([]any, 100_000)
	for i := range doubles {
		doubles[i] = 5e-324 // 327 characters written out
	}
	for _, tc := range []struct {
		text string
		s    string // payload.s
		l    []any  // payload.l
	}{
		{`payload.s.split("").size() > 0`, strings.Repeat("x", 2<<20), nil},
		{`payload.s.replace("", "0123456789") != ""`, strings.Repeat("x", 2<<20), nil},
		{`payload.s.matches(r"\pL{50}x")`, strings.Repeat("x", 400_000), nil},
		{`"%s".format([payload.l]) != ""`, "", doubles},
	} {
		t.Run(tc.text, func(t *testing.T) {
			_, prg, err := e.compile(tc.text, types.BoolType)
			if err != nil {
				t.Fatal(err)
			}
			a := vars(t, map[string]any{"payload": map[string]any{"s": tc.s, "l": tc.l}})
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			_, _, err = prg.Eval(a)
			runtime.ReadMemStats(&after)
			if !atLimit(err) {
				t.Fatalf("%v, want it stopped at the limit", err)
			}
			// What counting allocates (cel-go sizes a string as []rune,
			// 4 bytes a character, under -race), not what the call would
			// have: 150 MB for the split, 270 MB for the replace.
			if n := after.TotalAlloc - before.TotalAlloc; n > 16<<20 {
				t.Errorf("allocated %d bytes before it stopped: the call ran", n)
			}
		})
	}
}

// TestLeastChargeIsExact: what the check before a call takes as its least
// charge is at most what the count then charges (else the check would stop
// an evaluation the count lets finish), and, for the functions that write
// a result they are charged for, what it is exactly where the result is
// cheap to know. A model of cel-go's that changed would fail here.
func TestLeastChargeIsExact(t *testing.T) {
	e := newEnv(t)
	type call struct {
		id             string
		least, charged uint64
	}
	var calls []call
	checkedHook = func(c interpreter.InterpretableCall, _ []ref.Val, least, charged uint64) {
		calls = append(calls, call{c.OverloadID(), least, charged})
	}
	defer func() { checkedHook = nil }()
	big := strings.Repeat("ab,é ", 3000)
	for _, tc := range []struct {
		text  string
		exact bool // the least charge is the charge
	}{
		{`payload.s.lowerAscii()`, true},
		{`payload.s.upperAscii()`, true},
		{`payload.s.reverse()`, true},
		{`(" " + payload.s + " ").trim()`, true},
		{`payload.s.substring(7)`, true},
		{`payload.s.substring(7, 9000)`, true},
		{`payload.s.replace("b,", "XYZ")`, true},
		{`payload.s.replace("", "-")`, true},
		{`payload.s.replace("a", "", 5)`, true},
		{`payload.s.split(",").size() > 0`, true},
		{`payload.s.split("").size() > 0`, true},
		{`payload.s.split(",", 3).size() > 0`, true},
		{`[payload.s, "x", payload.s.substring(9)].join("--")`, true},
		{`[payload.s, "x"].join()`, true},
		{`payload.s.matches("b,+é")`, true},
		{`matches(payload.s, r"\pL{20}")`, true},
		{`string(bytes(payload.s))`, false},
		{`strings.quote(payload.s)`, false},
		{`"<%s|%d|%.2f|%x|%%>".format([payload.s, 12, 2.5, payload.s])`, false},
		{`"%s %s %s".format([[1.5, "x", {"k": [true, null]}], b"\xffz", 5e-324])`, false},
		{`"%s".format([[payload.s, payload.s.substring(5)]])`, false},
	} {
		calls = calls[:0]
		_, prg, err := e.compile(tc.text, types.StringType)
		if err != nil {
			_, prg, err = e.compile(tc.text, types.BoolType)
		}
		if err != nil {
			t.Fatalf("%s: %v", tc.text, err)
		}
		if _, _, err := prg.Eval(vars(t, map[string]any{"payload": map[string]any{"s": big}})); err != nil {
			t.Fatalf("%s: %v", tc.text, err)
		}
		if len(calls) == 0 {
			t.Fatalf("%s: no call was checked", tc.text)
		}
		c := calls[len(calls)-1] // the outermost
		if strings.HasSuffix(tc.text, "> 0") {
			c = calls[len(calls)-3] // the outermost but size() and >
		}
		if c.least > c.charged || tc.exact && c.least != c.charged || !tc.exact && c.least < c.charged/2 {
			t.Errorf("%s: %s charged %d; the check's least charge %d", tc.text, c.id, c.charged, c.least)
		}
	}
}
