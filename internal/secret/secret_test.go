package secret

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRead(t *testing.T) {
	dir := t.TempDir()
	for content, want := range map[string]string{
		"pw\n":               "pw",
		"pw\r\n":             "pw",
		"pw":                 "pw",
		" pw with spaces \n": " pw with spaces ",
		"\n":                 "",
		"":                   "",
	} {
		f := filepath.Join(dir, "s")
		if err := os.WriteFile(f, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := Read(f)
		if want == "" {
			if err == nil || !strings.Contains(err.Error(), "is empty") {
				t.Errorf("Read(%q) = %q, %v; want an error that it is empty", content, got, err)
			}
			continue
		}
		if err != nil || got != want {
			t.Errorf("Read(%q) = %q, %v; want %q", content, got, err, want)
		}
	}
	if _, err := Read(filepath.Join(dir, "missing")); err == nil {
		t.Error("Read of a missing file: no error")
	}
}

func TestLines(t *testing.T) {
	f := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(f, []byte("  first \n\nsecond\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := Lines(f)
	if err != nil || strings.Join(got, ",") != "first,second" {
		t.Fatalf("Lines = %q, %v", got, err)
	}
	if err := os.WriteFile(f, []byte("\n \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Lines(f); err == nil || strings.Contains(err.Error(), " \n") {
		t.Fatalf("Lines of an empty file: %v", err)
	}
}
