package expr

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"unicode/utf8"

	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"
)

// An event's JSON, as its table's expressions read it: numbers as Number
// reads them, and a document with a number too large for a double (for
// which Number has no value) is refused, whether it is read whole or by
// member, and whichever member holds it, as a document that is not JSON
// is.

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
	if bytes.IndexByte(b, '{') >= 0 {
		// The decode keeps the last of a member named twice, and a
		// number no double holds in the one before would pass unseen,
		// where the payload's reader refuses it (FuzzReadJSON found
		// {"b":1e700,"b":0}): a payload holding one is not read.
		if err := everyNumber(b); err != nil {
			return nil, err
		}
	}
	return numbers(v)
}

// everyNumber checks each number of the JSON text b, which decodes, as
// number does.
func everyNumber(b []byte) error {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	for {
		tok, err := d.Token()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if n, ok := tok.(json.Number); ok {
			if _, err := number(string(n)); err != nil {
				return err
			}
		}
	}
}

// numbers replaces the json.Numbers in v by Number's values.
func numbers(v any) (any, error) {
	var err error
	switch x := v.(type) {
	case json.Number:
		return number(string(x))
	case map[string]any:
		for k, e := range x {
			if x[k], err = numbers(e); err != nil {
				return nil, err
			}
		}
	case []any:
		for i, e := range x {
			if x[i], err = numbers(e); err != nil {
				return nil, err
			}
		}
	}
	return v, nil
}

// ReadJSON fills o from the JSON object b: each member o names parsed, the
// others skipped, not parsed, so that a large payload costs a scan, not a
// parse. The scan checks every byte as encoding/json does: b is read only
// if the whole parse would take it for an object (a payload that is not
// JSON makes the event invalid, whichever members the expressions read). A
// member named twice is the last one, as encoding/json has it.
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
		if end, err = skipValue(b, start, 1); err != nil {
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
		return number(string(v))
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

// maxDepth is encoding/json's limit on how deep arrays and objects nest
// (its scanner's maxNestingDepth), the payload's own object counted: a
// payload nested deeper is not JSON to the whole parse, so not to the
// reader either.
const maxDepth = 10000

// skipString is the index after the string that starts at b[i] ('"'),
// checked as encoding/json checks one: an escape is one of JSON's, and no
// byte is a control character (a byte that is not UTF-8 is taken, and
// read as U+FFFD).
func skipString(b []byte, i int) (int, error) {
	for j := i + 1; ; {
		switch j = special(b, j); {
		case j == len(b):
			return 0, syntaxError(b, j, "the end of a string")
		case b[j] == '"':
			return j + 1, nil
		case b[j] < 0x20:
			return 0, syntaxError(b, j, "a character (a control character must be escaped)")
		}
		if j++; j == len(b) {
			return 0, syntaxError(b, j, "an escape")
		}
		switch b[j] {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			j++
		case 'u':
			if j+4 >= len(b) || !hex(b[j+1]) || !hex(b[j+2]) || !hex(b[j+3]) || !hex(b[j+4]) {
				return 0, syntaxError(b, min(j+1, len(b)), "an escape's four hex digits")
			}
			j += 5
		default:
			return 0, syntaxError(b, j, "an escape")
		}
	}
}

// special is the index of the first byte from b[j] on that ends a
// string's plain run: a quote, a backslash or a control character; or
// len(b). A short run, as most member names and values are, is looked at
// byte by byte; a long one is passed as a whole, bytes.IndexByte finding
// its end and control checking it 8 bytes at a time.
func special(b []byte, j int) int {
	for n := min(len(b), j+16); j < n; j++ {
		if c := b[j]; c == '"' || c == '\\' || c < 0x20 {
			return j
		}
	}
	if j == len(b) {
		return j
	}
	end := len(b)
	if k := bytes.IndexByte(b[j:], '"'); k >= 0 {
		end = j + k
	}
	if k := bytes.IndexByte(b[j:end], '\\'); k >= 0 {
		end = j + k
	}
	if k := control(b[j:end]); k >= 0 {
		end = j + k
	}
	return end
}

// control is the index of the first control character (a byte under
// 0x20) in s, or -1. A word holds one if subtracting 0x20 from each of its
// bytes borrows where the byte's top bit was clear: that finds none where
// there is none, and the bytes are then looked at one by one.
func control(s []byte) int {
	i := 0
	for ; i+8 <= len(s); i += 8 {
		x := binary.LittleEndian.Uint64(s[i:])
		if (x-0x2020202020202020)&^x&0x8080808080808080 != 0 {
			break
		}
	}
	for ; i < len(s); i++ {
		if s[i] < 0x20 {
			return i
		}
	}
	return -1
}

func hex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// skipValue is the index after the JSON value that starts at b[i], inside
// depth arrays and objects. It checks everything it passes as encoding/json
// does, though the members it skips are not read.
func skipValue(b []byte, i, depth int) (int, error) {
	if i == len(b) {
		return 0, syntaxError(b, i, "a value")
	}
	switch c := b[i]; {
	case c == '"':
		return skipString(b, i)
	case c == '{' || c == '[':
		if depth++; depth > maxDepth {
			return 0, fmt.Errorf("invalid JSON at byte %d: arrays and objects nested deeper than %d", i, maxDepth)
		}
		return skipContainer(b, i, depth)
	case c == '-' || '0' <= c && c <= '9':
		return skipNumber(b, i)
	}
	for _, lit := range [...]string{"true", "false", "null"} {
		if len(b)-i >= len(lit) && string(b[i:i+len(lit)]) == lit {
			return i + len(lit), nil
		}
	}
	return 0, syntaxError(b, i, "a value")
}

// skipContainer is the index after the array or object that starts at b[i].
func skipContainer(b []byte, i, depth int) (int, error) {
	object, closing, after := b[i] == '{', byte(']'), "',' or ']'"
	if object {
		closing, after = '}', "',' or '}'"
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == closing {
		return i + 1, nil
	}
	for {
		var err error
		if object {
			if i == len(b) || b[i] != '"' {
				return 0, syntaxError(b, i, "a member name")
			}
			if i, err = skipString(b, i); err != nil {
				return 0, err
			}
			if i = skipSpace(b, i); i == len(b) || b[i] != ':' {
				return 0, syntaxError(b, i, "':'")
			}
			i = skipSpace(b, i+1)
		}
		if i, err = skipValue(b, i, depth); err != nil {
			return 0, err
		}
		switch i = skipSpace(b, i); {
		case i < len(b) && b[i] == ',':
			i = skipSpace(b, i+1)
		case i < len(b) && b[i] == closing:
			return i + 1, nil
		default:
			return 0, syntaxError(b, i, after)
		}
	}
}

// skipNumber is the index after the number that starts at b[i], in JSON's
// grammar: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?, and one a
// double holds (what the whole parse refuses, numbers, below). What
// follows it is for the array or object holding it to check.
func skipNumber(b []byte, i int) (int, error) {
	start := i
	if b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && '1' <= b[i] && b[i] <= '9':
		i = digits(b, i)
	default:
		return 0, syntaxError(b, i, "a digit")
	}
	whole := i - start // an upper bound of the integer part's digits
	if i < len(b) && b[i] == '.' {
		if i++; i == len(b) || b[i] < '0' || b[i] > '9' {
			return 0, syntaxError(b, i, "a digit")
		}
		i = digits(b, i)
	}
	exponent := 0 // the exponent, as far as 10^5 either way
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		negative := false
		if i++; i < len(b) && (b[i] == '+' || b[i] == '-') {
			negative = b[i] == '-'
			i++
		}
		if i == len(b) || b[i] < '0' || b[i] > '9' {
			return 0, syntaxError(b, i, "a digit")
		}
		for ; i < len(b) && '0' <= b[i] && b[i] <= '9'; i++ {
			exponent = min(10*exponent+int(b[i]-'0'), 100_000)
		}
		if negative {
			exponent = -exponent
		}
	}
	// Under 10^308 (whole digits and the exponent together at most 308)
	// it fits; past that, ParseFloat says.
	if whole+exponent > 308 {
		if _, err := number(string(b[start:i])); err != nil {
			return 0, err
		}
	}
	return i, nil
}

func digits(b []byte, i int) int {
	for i < len(b) && '0' <= b[i] && b[i] <= '9' {
		i++
	}
	return i
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
