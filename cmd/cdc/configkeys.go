package main

import (
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// checkNode walks a parsed config file against the type it will be decoded
// into, and reports the first problem as one line that names the key, its
// line, and what to write instead: an unknown key with the closest known
// one, a duration without a unit, a number or switch that is not one.
// yaml.v3's own messages name Go types ("field borkers not found in type
// struct { Brokers []string ...") and span lines. It also accepts a bare 0
// as a duration, which yaml.v3 refuses, by rewriting the node to "0s".
func checkNode(n *yaml.Node, t reflect.Type, path string) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if n.Kind == yaml.DocumentNode {
		for _, c := range n.Content {
			if err := checkNode(c, t, path); err != nil {
				return err
			}
		}
		return nil
	}
	if n.Kind == yaml.AliasNode || (n.Kind == yaml.ScalarNode && n.Tag == "!!null") {
		return nil
	}
	switch t.Kind() {
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			return fmt.Errorf("%s (line %d): expected a mapping of keys (see docs/config.md)", orTop(path), n.Line)
		}
		fields := yamlFields(t)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			f, ok := fields[k.Value]
			if !ok {
				return unknownKey(join(path, k.Value), k.Line, k.Value, fields)
			}
			if err := checkNode(v, f, join(path, k.Value)); err != nil {
				return err
			}
		}
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			return fmt.Errorf("%s (line %d): expected a list, such as [a, b]", path, n.Line)
		}
		for i, c := range n.Content {
			if err := checkNode(c, t.Elem(), fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			return fmt.Errorf("%s (line %d): expected a mapping, such as {key: value}", path, n.Line)
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			if err := checkNode(n.Content[i+1], t.Elem(), join(path, n.Content[i].Value)); err != nil {
				return err
			}
		}
	default:
		return checkScalar(n, t, path)
	}
	return nil
}

var durationType = reflect.TypeOf(time.Duration(0))

func checkScalar(n *yaml.Node, t reflect.Type, path string) error {
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("%s (line %d): expected a single value, not a list or mapping", path, n.Line)
	}
	switch {
	case t == durationType:
		if n.Value == "0" {
			n.Value, n.Tag = "0s", "!!str"
			return nil
		}
		if _, err := time.ParseDuration(n.Value); err != nil {
			return fmt.Errorf("%s (line %d): %q is not a duration; write a number with a unit, such as 500ms, 5s or 1m", path, n.Line, n.Value)
		}
	case t.Kind() == reflect.Bool:
		if n.Tag != "!!bool" {
			return fmt.Errorf("%s (line %d): %q is not true or false", path, n.Line, n.Value)
		}
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Int64:
		if _, err := strconv.ParseInt(n.Value, 0, t.Bits()); err != nil {
			return fmt.Errorf("%s (line %d): %q is not a whole number that fits (%d-bit)", path, n.Line, n.Value, t.Bits())
		}
	}
	return nil
}

// yamlFields maps a struct's YAML keys to their types.
func yamlFields(t reflect.Type) map[string]reflect.Type {
	fields := map[string]reflect.Type{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		fields[name] = f.Type
	}
	return fields
}

func unknownKey(path string, line int, key string, fields map[string]reflect.Type) error {
	known := make([]string, 0, len(fields))
	for k := range fields {
		known = append(known, k)
	}
	slices.Sort(known)
	best, bestD := "", len(key)
	for _, k := range known {
		if d := editDistance(key, k); d < bestD {
			best, bestD = k, d
		}
	}
	if best != "" && bestD <= max(2, len(key)/3) {
		return fmt.Errorf("unknown key %s (line %d); did you mean %s? (see docs/config.md)", path, line, best)
	}
	return fmt.Errorf("unknown key %s (line %d); the keys here are %s (see docs/config.md)", path, line, strings.Join(known, ", "))
}

// editDistance is the optimal string alignment distance: insertions,
// deletions, substitutions and swaps of neighbours each cost one, so that
// "borkers" is one step from "brokers".
func editDistance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	d := make([][]int, len(ra)+1)
	for i := range d {
		d[i] = make([]int, len(rb)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(ra); i++ {
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && ra[i-1] == rb[j-2] && ra[i-2] == rb[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(ra)][len(rb)]
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func orTop(path string) string {
	if path == "" {
		return "the file"
	}
	return path
}
