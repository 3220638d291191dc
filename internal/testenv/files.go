package testenv

import (
	"os"
	"path/filepath"
	"testing"
)

// WriteConfig writes body as cdc.yaml in a directory of the test's own,
// and returns its path.
func WriteConfig(t testing.TB, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "cdc.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
