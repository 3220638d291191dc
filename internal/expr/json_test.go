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
		{`{"n": 01}`, nil, `member "n"`},
		{`{"n": -Inf}`, nil, "invalid"},
		{`{"skip": "unterminated}`, nil, "the end of a string"},
		{`{"skip": [1, 2}, "n": 1}`, nil, "a matching bracket"},
	} {
		o := NewObject(names)
		err := o.ReadJSON([]byte(tc.in))
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: %v, want an error containing %q", tc.in, err, tc.err)
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

// FuzzReadJSON: on any input encoding/json takes for an object, an Object
// finds each member it names as the whole parse has it.
func FuzzReadJSON(f *testing.F) {
	for _, s := range []string{`{"a": 1, "b": "x"}`, `{"a": {"b": [1, {"c": "}"}]}, "b": null}`, `{"a\"": "\\", "b": -0.5e3}`, `{}`, "{\"a\": \"\x95\", \"\xffb\": 1}"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		var whole map[string]any
		if json.Unmarshal([]byte(in), &whole) != nil || whole == nil {
			return
		}
		names := []string{"a", "b", "a\""}
		o := NewObject(names)
		if err := o.ReadJSON([]byte(in)); err != nil {
			t.Fatalf("%q: %v, which encoding/json reads", in, err)
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
