package expr

import (
	"encoding/json"
	"strings"
	"testing"

	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"
)

// TestReadJSON: an Object reads the members it names, as a whole parse
// would, skipping the others, however they nest or escape; an input that
// is not a JSON object is an error.
func TestReadJSON(t *testing.T) {
	names := []string{"customerId", "n", "nested", "é\"q"}
	for _, tc := range []struct {
		in   string
		want map[string]string // member → its value's text; absent: not there
		err  string
	}{
		{`{"customerId": "c-42", "n": 9007199254740993, "pad": "x"}`, map[string]string{"customerId": "c-42", "n": "9007199254740993"}, ""},
		{`{"skip": {"a": [1, "}\"]", {"b": "]"}]}, "n": 1.5, "nested": {"k": [true, null]}}`, map[string]string{"n": "1.5", "nested": "map[k:[true <nil>]]"}, ""},
		{`{"customerId": "a\"b\\", "\u00e9\"q": false}`, map[string]string{"customerId": `a"b\`, "é\"q": "false"}, ""},
		{` { } `, map[string]string{}, ""},
		{`{"n": 1, "n": 2}`, map[string]string{"n": "2"}, ""},
		{`{"customerId": null}`, map[string]string{"customerId": "NULL_VALUE"}, ""},
		{`[1, 2]`, nil, "not a JSON object"},
		{`{"n": 1`, nil, "invalid JSON"},
		{`{"n": 1} x`, nil, "where the end of the payload should be"},
		{`{"n": 01}`, nil, "where ',' or '}' should be"},
		{`{"n": -Inf}`, nil, "invalid"},
		{`{"skip": "unterminated}`, nil, "the end of a string"},
		{`{"skip": [1, 2}, "n": 1}`, nil, "where ',' or ']' should be"},
		// A member skipped unread is checked as the whole parse checks it:
		// docs/config.md has a payload that is not JSON make the event
		// invalid, whichever members the expressions read.
		{`{"n": 1, "skip": nope}`, nil, "invalid JSON at byte 17"},
		{`{"skip": tru, "n": 1}`, nil, "a value"},
		{`{"skip": 01}`, nil, "where ',' or '}' should be"},
		{`{"skip": -}`, nil, "a digit"},
		{`{"skip": 1.}`, nil, "a digit"},
		{`{"skip": 1e+}`, nil, "a digit"},
		{`{"skip": [1,,2]}`, nil, "a value"},
		{`{"skip": [1, 2,]}`, nil, "a value"},
		{`{"skip": {"a" 1}}`, nil, "':'"},
		{`{"skip": {1: 2}}`, nil, "a member name"},
		{`{"skip": {"a": 1,}}`, nil, "a member name"},
		{`{"skip": "a\qb"}`, nil, "an escape"},
		{`{"skip": "\u12g4"}`, nil, "an escape"},
		{"{\"skip\": \"a\x01b\"}", nil, "a control character"},
		{"{\"customerId\": \"a\nb\"}", nil, "a control character"},
		{"{\"n\": 1, \"a\x1fb\": 2}", nil, "a control character"},
		// encoding/json's limit on nesting, the object itself counted.
		{`{"skip": ` + strings.Repeat("[", maxDepth) + strings.Repeat("]", maxDepth) + `}`, nil, "deeper than"},
		{`{"skip": ` + strings.Repeat("[", maxDepth-1) + strings.Repeat("]", maxDepth-1) + `, "n": 3}`, map[string]string{"n": "3"}, ""},
		{`{"skip": {"a": [1, -0.5e-3, 0, 1E9, true, false, null, "\u00e9\/\b\f\n\r\t"]}, "n": 3}`, map[string]string{"n": "3"}, ""},
	} {
		o := NewObject(names)
		err := o.ReadJSON([]byte(tc.in))
		if valid := json.Valid([]byte(tc.in)) && strings.HasPrefix(strings.TrimSpace(tc.in), "{"); valid != (tc.err == "") {
			t.Errorf("%.80s: encoding/json takes it for an object: %v; the case is wrong", tc.in, valid)
		}
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%.80s: %v, want an error containing %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.in, err)
			continue
		}
		for _, n := range names {
			v, found := o.Find(types.String(n))
			want, ok := tc.want[n]
			if found != ok || found && text(v) != want {
				t.Errorf("%s: member %q = %v (found %v), want %q (found %v)", tc.in, n, v, found, want, ok)
			}
		}
	}
}

// TestReadJSONSkipsWithoutAllocating: the members an Object does not name
// are checked and skipped where they lie, however they nest or escape.
func TestReadJSONSkipsWithoutAllocating(t *testing.T) {
	in := []byte(`{"skip": {"a": [1, -2.5e3, true, null, "x\"\u00e9` + strings.Repeat("y", 200) + `"]}, "pad": "` + strings.Repeat("z", 1000) + `"}`)
	o := NewObject([]string{"n"})
	if n := testing.AllocsPerRun(100, func() {
		if err := o.ReadJSON(in); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("%v allocations a read, want 0", n)
	}
}

func text(v ref.Val) string {
	switch v := v.(type) {
	case types.String:
		return string(v)
	case types.Null:
		return "NULL_VALUE"
	}
	return jsonText(v.Value())
}

func jsonText(v any) string {
	switch v := v.(type) {
	case map[string]any:
		var b strings.Builder
		b.WriteString("map[")
		first := true
		for k, e := range v {
			if !first {
				b.WriteString(" ")
			}
			first = false
			b.WriteString(k + ":" + jsonText(e))
		}
		return b.String() + "]"
	case []any:
		parts := make([]string, len(v))
		for i, e := range v {
			parts[i] = jsonText(e)
		}
		return "[" + strings.Join(parts, " ") + "]"
	case types.Null:
		return "<nil>"
	case ref.Val:
		return jsonText(v.Value())
	case nil:
		return "<nil>"
	}
	b, _ := json.Marshal(v)
	if s, ok := v.(string); ok {
		return s
	}
	return string(b)
}

// FuzzReadJSON: an Object reads exactly the language the whole parse
// reads: on any input, it accepts what encoding/json.Valid takes for an
// object whose every number a double holds (parseJSON), and nothing else,
// and finds each member it names as the whole parse has it.
func FuzzReadJSON(f *testing.F) {
	for _, s := range []string{`{"a": 1, "b": "x"}`, `{"a": {"b": [1, {"c": "}"}]}, "b": null}`, `{"a\"": "\\", "b": -0.5e3}`, `{}`, "{\"a\": \"\x95\", \"\xffb\": 1}",
		`{"a": 1, "c": nope}`, `{"c": [1, 2,], "a": 1}`, `{"c": "\q", "b": 2}`, "{\"c\": \"\x01\"}", `{"c": {"d" 1}}`, `{"c": -01.5e+3}`, `[1]`, ` {"a": true} `,
		`{"a": 1, "c": [1e999]}`, `{"a": 1.7976931348623159e308}`, `{"c": 0.00001e313, "b": 1e-999}`, `{"b": 1` + strings.Repeat("0", 309) + `}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		names := []string{"a", "b", "a\""}
		o := NewObject(names)
		err := o.ReadJSON([]byte(in))
		_, whole := parseJSON([]byte(in))
		object := json.Valid([]byte(in)) && strings.HasPrefix(strings.TrimLeft(in, " \t\r\n"), "{") && whole == nil
		if object != (err == nil) {
			t.Fatalf("%q: read: %v; an object to encoding/json and to the whole parse (%v): %v", in, err, whole, object)
		}
		if !object {
			return
		}
		full, err := parseJSON([]byte(in))
		if err != nil {
			t.Fatalf("%q: %v", in, err)
		}
		for _, n := range names {
			want, ok := full.(map[string]any)[n]
			got, found := o.Find(types.String(n))
			if found != ok {
				t.Fatalf("%q: member %q found %v, the whole parse %v", in, n, found, ok)
			}
			if found && jsonText(got) != jsonText(want) {
				t.Fatalf("%q: member %q = %s, the whole parse %s", in, n, jsonText(got), jsonText(want))
			}
		}
	})
}

// BenchmarkReadJSON reads one member of a payload as the hot path does:
// a 120-byte one, and a 100 KB one whose other members (nested objects,
// arrays and strings with escapes) are skipped.
func BenchmarkReadJSON(b *testing.B) {
	var large strings.Builder
	large.WriteString(`{"pad": [`)
	for large.Len() < 100_000 {
		large.WriteString(`{"k": "v\"\\x", "n": [1, 2.5e3, true, null, {"d": "é"}]}, `)
	}
	large.WriteString(`0], "i": 42}`)
	for _, tc := range []struct{ name, in string }{
		{"120B", `{"i": 42, "pad": "` + strings.Repeat("x", 100) + `"}`},
		{"100KB", large.String()},
	} {
		b.Run(tc.name, func(b *testing.B) {
			o := NewObject([]string{"i"})
			in := []byte(tc.in)
			b.SetBytes(int64(len(in)))
			b.ReportAllocs()
			for b.Loop() {
				if err := o.ReadJSON(in); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
