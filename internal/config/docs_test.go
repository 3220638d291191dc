package config

import (
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestDocsConfigsValidate loads every YAML block of the README and docs/
// with the real config loader, so that documented configs stay valid.
func TestDocsConfigsValidate(t *testing.T) {
	files, _ := filepath.Glob("../../docs/*.md")
	files = append(files, "../../README.md")
	block := regexp.MustCompile("(?s)```yaml\n(.*?)```")
	n := 0
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, m := range block.FindAllStringSubmatch(string(raw), -1) {
			n++
			// The files a block names (password_file, signing_key_file)
			// are the reader's: here each is a stand-in with a key in it.
			dir := t.TempDir()
			body := regexp.MustCompile(`(\w+_file): *(\S+)`).ReplaceAllStringFunc(m[1], func(kv string) string {
				k, v, _ := strings.Cut(kv, ":")
				stand := filepath.Join(dir, filepath.Base(strings.TrimSpace(v)))
				os.WriteFile(stand, []byte("0123456789abcdef0123456789abcdef\n"), 0o600)
				return k + ": " + stand
			})
			path := filepath.Join(dir, "cdc.yaml")
			if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
				t.Fatal(err)
			}
			// KAFKA_PASSWORD: config.md's ${VAR} example.
			docEnv := env("CDC_POSTGRES_URL", "postgres://u@h/d", "CDC_KAFKA_BROKERS", "k:9092", "KAFKA_PASSWORD", "example")
			if _, _, err := validConfig(path, docEnv); err != nil {
				t.Errorf("%s, yaml block %d: %v\n%s", f, i+1, err, m[1])
			}
		}
	}
	if n < 2 {
		t.Fatalf("found %d yaml blocks in the docs", n)
	}
}

// TestEveryConfigKeyIsDocumented walks the YAML keys cdc reads and wants
// each in docs/config.md: as `a.b` anywhere, or by its own name in the
// section of its top-level key ("## `kafka`").
func TestEveryConfigKeyIsDocumented(t *testing.T) {
	raw, err := os.ReadFile("../../docs/config.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	keys := yamlKeys(reflect.TypeOf(fileConfig{}), "")
	if len(keys) < 30 {
		t.Fatalf("found only %d config keys: the walk is broken", len(keys))
	}
	for _, key := range keys {
		if !documented(doc, key) {
			t.Errorf("config key %s is not documented in docs/config.md", key)
		}
	}
}

// yamlKeys lists the dotted paths of every key of a YAML-tagged struct.
func yamlKeys(typ reflect.Type, prefix string) []string {
	var keys []string
	for i := 0; i < typ.NumField(); i++ {
		f := typ.Field(i)
		name, flags, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if flags == "inline" {
			keys = append(keys, yamlKeys(f.Type, prefix)...)
			continue
		}
		if name == "" || name == "-" {
			continue
		}
		keys = append(keys, prefix+name)
		ft := f.Type
		for ft.Kind() == reflect.Pointer || ft.Kind() == reflect.Slice {
			ft = ft.Elem()
		}
		if ft.Kind() == reflect.Struct && ft != reflect.TypeOf(time.Duration(0)) {
			keys = append(keys, yamlKeys(ft, prefix+name+".")...)
		}
	}
	return keys
}

func documented(doc, key string) bool {
	if strings.Contains(doc, "`"+key+"`") {
		return true
	}
	top, _, nested := strings.Cut(key, ".")
	if !nested {
		return false
	}
	_, section, ok := strings.Cut(doc, "## `"+top+"`")
	if !ok {
		return false
	}
	if end := strings.Index(section, "\n## "); end >= 0 {
		section = section[:end]
	}
	// Any tail of the path will do in its section: `tls`, `topic_defaults.partitions`.
	parts := strings.Split(key, ".")
	for i := 1; i < len(parts); i++ {
		tail := strings.Join(parts[i:], ".")
		if strings.Contains(section, "`"+tail+"`") {
			return true
		}
	}
	leaf := parts[len(parts)-1]
	return strings.Contains(section, "{"+leaf+":") || strings.Contains(section, ", "+leaf+":")
}

// TestEveryFieldSaysItsKey: every exported field of the types the file
// decodes into, the stages' configs among them, has a yaml tag: its key, or
// "-" for a setting that is not the file's. An untagged field would be a
// key by its Go name, and CDC_ variable, that nobody chose.
func TestEveryFieldSaysItsKey(t *testing.T) {
	seen := map[reflect.Type]bool{}
	var walk func(reflect.Type, string)
	walk = func(typ reflect.Type, path string) {
		for typ.Kind() == reflect.Pointer || typ.Kind() == reflect.Slice || typ.Kind() == reflect.Map {
			typ = typ.Elem()
		}
		if typ.Kind() != reflect.Struct || typ == reflect.TypeOf(time.Duration(0)) || seen[typ] || typ.Implements(optionalType) {
			return
		}
		seen[typ] = true
		for i := 0; i < typ.NumField(); i++ {
			f := typ.Field(i)
			if !f.IsExported() {
				continue
			}
			tag, ok := f.Tag.Lookup("yaml")
			if !ok {
				t.Errorf("%s.%s (%s) has no yaml tag: give it its key, or yaml:\"-\"", path, f.Name, typ)
				continue
			}
			if tag != "-" {
				walk(f.Type, path+"."+f.Name)
			}
		}
	}
	walk(reflect.TypeOf(fileConfig{}), "fileConfig")
	if len(seen) < 10 {
		t.Fatalf("walked %d types: the walk is broken", len(seen))
	}
}
