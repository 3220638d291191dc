package config

import (
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// checkNode walks a parsed config file against the type it will be decoded
// into, and reports the first problem as one line that names the key, its
// line, and what to write instead: an unknown key with the closest known
// one, a duration without a unit, a number or switch that is not one.
// yaml.v3's own messages name Go types ("field borkers not found in type
// struct { Brokers []string ...") and span lines. It also accepts a bare 0
// as a duration, which yaml.v3 refuses, by rewriting the node to "0s".
func checkNode(n *yaml.Node, t reflect.Type, path string) error {
	t = settingType(t)
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
		if n.Kind == yaml.ScalarNode && t.Implements(shorthandType) {
			return nil // the short form, checked where it is used
		}
		if n.Kind != yaml.MappingNode {
			return fmt.Errorf("%s (%s): expected a mapping of keys (see docs/config.md)", orTop(path), at(n))
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
			return fmt.Errorf("%s (%s): expected a list, such as [a, b]", path, at(n))
		}
		for i, c := range n.Content {
			if err := checkNode(c, t.Elem(), fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			return fmt.Errorf("%s (%s): expected a mapping, such as {key: value}", path, at(n))
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

// optionalType is what an opt.Value implements: a setting that may be
// unset, checked and set from the environment as its element.
var optionalType = reflect.TypeOf((*interface{ Elem() reflect.Type })(nil)).Elem()

// settingType is the type a setting of type t is written as: a pointer's
// element, an opt.Value's.
func settingType(t reflect.Type) reflect.Type {
	for {
		switch {
		case t.Kind() == reflect.Pointer:
			t = t.Elem()
		case t.Kind() == reflect.Struct && t.Implements(optionalType):
			t = reflect.Zero(t).Interface().(interface{ Elem() reflect.Type }).Elem()
		default:
			return t
		}
	}
}

// shorthandType is what a mapping that may be written as a scalar
// implements (tables[].schema).
var shorthandType = reflect.TypeOf((*interface{ shorthand() })(nil)).Elem()

func checkScalar(n *yaml.Node, t reflect.Type, path string) error {
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("%s (%s): expected a single value, not a list or mapping", path, at(n))
	}
	switch {
	case t == durationType:
		if n.Value == "0" {
			n.Value, n.Tag = "0s", "!!str"
			return nil
		}
		d, err := time.ParseDuration(n.Value)
		if err != nil {
			return fmt.Errorf("%s (%s): %q is not a duration; write a number with a unit, such as 500ms, 5s or 1m", path, at(n), n.Value)
		}
		if d < 0 {
			return fmt.Errorf("%s (%s): %q is negative; a duration is 0 or more (0 turns some settings off, see docs/config.md)", path, at(n), n.Value)
		}
	case t.Kind() == reflect.Bool:
		if n.ShortTag() != "!!bool" {
			return fmt.Errorf("%s (%s): %q is not true or false", path, at(n), n.Value)
		}
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Int64:
		if _, err := strconv.ParseInt(n.Value, 0, t.Bits()); err != nil {
			return fmt.Errorf("%s (%s): %q is not a whole number that fits (%d-bit)", path, at(n), n.Value, t.Bits())
		}
	}
	return nil
}

// yamlFields maps a struct's YAML keys to their types, an inline
// struct's keys among them.
func yamlFields(t reflect.Type) map[string]reflect.Type {
	fields := map[string]reflect.Type{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, flags, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if flags == "inline" {
			maps.Copy(fields, yamlFields(f.Type))
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

// expandEnv replaces ${NAME} and ${NAME:-default} in the file's values
// with the environment's, so that a secret need never be written in the
// file; $${ is a literal ${. It works on parsed values, not on the text, so
// a value can never change the file's structure. An unquoted value is typed
// again after expansion (port: ${PORT} is a number); a quoted one stays a
// string.
func expandEnv(n *yaml.Node, env Environ, path string) error {
	switch n.Kind {
	case yaml.DocumentNode, yaml.SequenceNode:
		for i, c := range n.Content {
			p := path
			if n.Kind == yaml.SequenceNode {
				p = fmt.Sprintf("%s[%d]", path, i)
			}
			if err := expandEnv(c, env, p); err != nil {
				return err
			}
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			if err := expandEnv(n.Content[i+1], env, join(path, n.Content[i].Value)); err != nil {
				return err
			}
		}
	case yaml.ScalarNode:
		if !strings.Contains(n.Value, "${") {
			return nil
		}
		v, err := expandValue(n.Value, env)
		if err != nil {
			return fmt.Errorf("%s (line %d): %v", orTop(path), n.Line, err)
		}
		n.Value = v
		if n.Style == 0 {
			n.Tag = "" // typed again from the new value
		}
	}
	return nil
}

func expandValue(s string, env Environ) (string, error) {
	var b strings.Builder
	for {
		i := strings.Index(s, "${")
		if i < 0 {
			b.WriteString(s)
			return b.String(), nil
		}
		if i > 0 && s[i-1] == '$' { // $${: a literal ${
			b.WriteString(s[:i-1] + "${")
			s = s[i+2:]
			continue
		}
		b.WriteString(s[:i])
		end := strings.IndexByte(s[i:], '}')
		if end < 0 {
			return "", errors.New("a ${ without its }") // the value may hold a secret: not quoted
		}
		ref := s[i+2 : i+end]
		name, def, hasDef := strings.Cut(ref, ":-")
		if !validEnvName(name) {
			return "", fmt.Errorf("${%s}: %q is not an environment variable name", ref, name)
		}
		v, ok := env(name)
		switch {
		case ok && (v != "" || !hasDef): // as in the shell: :- also replaces an empty value
			b.WriteString(v)
		case hasDef:
			b.WriteString(def)
		default:
			return "", fmt.Errorf("${%s} is not set: set it, or give a default as ${%s:-value}", name, name)
		}
		s = s[i+end+1:]
	}
}

func validEnvName(s string) bool {
	if s == "" || (s[0] >= '0' && s[0] <= '9') {
		return false
	}
	for _, c := range s {
		if !(c == '_' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// envKeys lists the environment variable of every setting that has one:
// CDC_ and the key's path in capitals, with _ for . (kafka.max_batch_delay
// is CDC_KAFKA_MAX_BATCH_DELAY). Lists of tables and free-form maps have
// none; a list of strings is written comma-separated.
func envKeys(t reflect.Type, path []string, f func(name string, path []string, t reflect.Type)) {
	t = settingType(t)
	if t.Kind() == reflect.Struct && t != durationType {
		fields := yamlFields(t)
		keys := make([]string, 0, len(fields))
		for k := range fields {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			envKeys(fields[k], append(slices.Clone(path), k), f)
		}
		return
	}
	if t.Kind() == reflect.Map || (t.Kind() == reflect.Slice && t.Elem().Kind() != reflect.String) {
		return
	}
	f("CDC_"+strings.ToUpper(strings.Join(path, "_")), path, t)
}

// applyEnv sets every key whose CDC_ variable is set and not empty in the
// parsed file, creating it if the file lacks it (or if there is no file).
// The node it sets remembers the variable, for error messages.
func applyEnv(doc *yaml.Node, t reflect.Type, env Environ) error {
	var err error
	envKeys(t, nil, func(name string, path []string, ft reflect.Type) {
		v, ok := env(name)
		if !ok || v == "" || err != nil {
			return
		}
		if doc.Kind == 0 {
			*doc = yaml.Node{Kind: yaml.DocumentNode, Content: []*yaml.Node{{Kind: yaml.MappingNode, Tag: "!!map"}}}
		}
		m := doc.Content[0]
		for _, k := range path[:len(path)-1] {
			if m, err = child(m, k, name); err != nil {
				return
			}
			if m.Kind != yaml.MappingNode { // null or empty in the file
				*m = yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
			}
		}
		var leaf *yaml.Node
		if leaf, err = child(m, path[len(path)-1], name); err != nil {
			return
		}
		*leaf = yaml.Node{Kind: yaml.ScalarNode, Value: v, HeadComment: "from " + name}
		if ft.Kind() == reflect.Slice {
			*leaf = yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq", HeadComment: "from " + name}
			for _, item := range strings.Split(v, ",") {
				if item = strings.TrimSpace(item); item != "" {
					leaf.Content = append(leaf.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: item, HeadComment: "from " + name})
				}
			}
		} else if ft.Kind() == reflect.String {
			leaf.Tag = "!!str" // as given: CDC_KAFKA_CLIENT_ID=123 stays a name
		}
	})
	return err
}

// child returns key's value in mapping m, adding it if missing.
func child(m *yaml.Node, key, name string) (*yaml.Node, error) {
	if m.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("%s: the file's %q is not a mapping, so it cannot be set from the environment", name, key)
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1], nil
		}
	}
	v := &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null"}
	m.Content = append(m.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: key}, v)
	return v, nil
}

// at says where a value came from: its line, or its variable.
func at(n *yaml.Node) string {
	if n.Line == 0 && strings.HasPrefix(n.HeadComment, "from ") {
		return n.HeadComment
	}
	return fmt.Sprintf("line %d", n.Line)
}
