package expr

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"unicode/utf8"

	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"
)

// An event's JSON, as its table's expressions read it: numbers as Number
// reads them.

// JSON is the JSON document b, parsed whole; nil (NULL) is null.
func JSON(b []byte) (any, error) {
	if b == nil {
		return Null, nil
	}
	v, err := parseJSON(b)
	if err != nil {
		return nil, err
	}
	return Value(v), nil
}

// parseJSON parses b into Go values, its numbers Number's.
func parseJSON(b []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	if _, err := d.Token(); err != io.EOF {
		return nil, errors.New("more than one JSON value")
	}
	return numbers(v), nil
}

// numbers replaces the json.Numbers in v by Number's values.
func numbers(v any) any {
	switch v := v.(type) {
	case json.Number:
		return Number(string(v))
	case map[string]any:
		for k, e := range v {
			v[k] = numbers(e)
		}
	case []any:
		for i, e := range v {
			v[i] = numbers(e)
		}
	}
	return v
}

// ReadJSON fills o from the JSON object b: each member o names parsed, the
// others skipped, not parsed, so that a large payload costs a scan, not a
// parse. A member named twice is the last one, as encoding/json has it.
func (o *Object) ReadJSON(b []byte) error {
	clear(o.vals)
	i := skipSpace(b, 0)
	if i == len(b) || b[i] != '{' {
		return errors.New("it is not a JSON object, and the expressions read members of it")
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return trailing(b, i+1)
	}
	for {
		if i == len(b) || b[i] != '"' {
			return syntaxError(b, i, "a member name")
		}
		end, err := skipString(b, i)
		if err != nil {
			return err
		}
		at, err := o.named(b[i:end])
		if err != nil {
			return err
		}
		i = skipSpace(b, end)
		if i == len(b) || b[i] != ':' {
			return syntaxError(b, i, "':'")
		}
		start := skipSpace(b, i+1)
		if end, err = skipValue(b, start); err != nil {
			return err
		}
		if at >= 0 {
			if o.vals[at], err = jsonValue(b[start:end]); err != nil {
				return fmt.Errorf("member %q: %w", o.names[at], err)
			}
		}
		i = skipSpace(b, end)
		switch {
		case i < len(b) && b[i] == ',':
			i = skipSpace(b, i+1)
		case i < len(b) && b[i] == '}':
			return trailing(b, i+1)
		default:
			return syntaxError(b, i, "',' or '}'")
		}
	}
}

// jsonValue parses one JSON value: a string without escapes, a number and
// a literal directly, anything else with parseJSON. A string that is not
// valid UTF-8 goes to parseJSON too, which puts U+FFFD for each bad byte,
// as it does in the whole parse (FuzzReadJSON found the difference).
func jsonValue(v []byte) (ref.Val, error) {
	switch {
	case len(v) >= 2 && v[0] == '"' && plain(v[1:len(v)-1]):
		return types.String(v[1 : len(v)-1]), nil
	case string(v) == "true":
		return types.True, nil
	case string(v) == "false":
		return types.False, nil
	case string(v) == "null":
		return types.NullValue, nil
	case len(v) > 0 && (v[0] == '-' || v[0] >= '0' && v[0] <= '9') && json.Valid(v):
		return Number(string(v)).(ref.Val), nil
	}
	x, err := parseJSON(v)
	if err != nil {
		return nil, err
	}
	return types.DefaultTypeAdapter.NativeToValue(x), nil
}

// named is the index in o.names of the member name s (a JSON string, with
// its quotes), or -1. A name without escapes, the usual, is compared where
// it lies, with no copy.
func (o *Object) named(s []byte) (int, error) {
	raw := s[1 : len(s)-1]
	if !plain(raw) {
		var name string
		if err := json.Unmarshal(s, &name); err != nil {
			return -1, err
		}
		raw = []byte(name)
	}
	for i, n := range o.names {
		if string(raw) == n {
			return i, nil
		}
	}
	return -1, nil
}

// plain reports whether the inside of a JSON string reads as its bytes: no
// escape, and valid UTF-8.
func plain(raw []byte) bool {
	return bytes.IndexByte(raw, '\\') < 0 && utf8.Valid(raw)
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString is the index after the string that starts at b[i] ('"'): the
// first quote after it that an odd run of backslashes does not escape.
func skipString(b []byte, i int) (int, error) {
	for j := i + 1; j < len(b); j++ {
		k := bytes.IndexByte(b[j:], '"')
		if k < 0 {
			break
		}
		j += k
		escapes := 0
		for e := j - 1; e > i && b[e] == '\\'; e-- {
			escapes++
		}
		if escapes%2 == 0 {
			return j + 1, nil
		}
	}
	return 0, syntaxError(b, len(b), "the end of a string")
}

// skipValue is the index after the JSON value that starts at b[i]. It
// checks the brackets and strings it passes, not every character: the
// members it skips are not read.
func skipValue(b []byte, i int) (int, error) {
	if i == len(b) {
		return 0, syntaxError(b, i, "a value")
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		var open []byte
		for j := i; j < len(b); j++ {
			switch c := b[j]; c {
			case '"':
				end, err := skipString(b, j)
				if err != nil {
					return 0, err
				}
				j = end - 1
			case '{', '[':
				open = append(open, c)
			case '}', ']':
				if len(open) == 0 || open[len(open)-1] != c-2 { // '{' is '}'-2, '[' is ']'-2
					return 0, syntaxError(b, j, "a matching bracket")
				}
				if open = open[:len(open)-1]; len(open) == 0 {
					return j + 1, nil
				}
			}
		}
		return 0, syntaxError(b, len(b), "a closing bracket")
	}
	j := i
	for j < len(b) && !endsValue(b[j]) {
		j++
	}
	if j == i {
		return 0, syntaxError(b, i, "a value")
	}
	return j, nil
}

// endsValue reports whether c ends a number or a literal.
func endsValue(c byte) bool {
	switch c {
	case ',', '}', ']', ' ', '\t', '\n', '\r':
		return true
	}
	return false
}

// trailing checks that only space follows the object that ended at b[i-1].
func trailing(b []byte, i int) error {
	if i = skipSpace(b, i); i != len(b) {
		return syntaxError(b, i, "the end of the payload")
	}
	return nil
}

func syntaxError(b []byte, i int, want string) error {
	if i >= len(b) {
		return fmt.Errorf("invalid JSON: it ends where %s should be", want)
	}
	return fmt.Errorf("invalid JSON at byte %d: %q where %s should be", i, b[i], want)
}
