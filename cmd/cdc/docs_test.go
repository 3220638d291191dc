package main

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"
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
			path := filepath.Join(t.TempDir(), "cdc.yaml")
			if err := os.WriteFile(path, []byte(m[1]), 0o600); err != nil {
				t.Fatal(err)
			}
			if _, _, err := validConfig(path, env("CDC_POSTGRES_URL", "postgres://u@h/d", "CDC_KAFKA_BROKERS", "k:9092")); err != nil {
				t.Errorf("%s, yaml block %d: %v\n%s", f, i+1, err, m[1])
			}
		}
	}
	if n < 2 {
		t.Fatalf("found %d yaml blocks in the docs", n)
	}
}
