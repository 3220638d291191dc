package postgres

import (
	"strings"
	"testing"
)

// TestWeaknesses (issue 24): the sslmodes that let a network attacker
// read or pose as the server are named; verify-full and a Unix socket are
// not.
func TestWeaknesses(t *testing.T) {
	for _, tt := range []struct {
		url, want string
	}{
		{"postgres://cdc@db:5432/app", "falls back to plaintext"},
		{"postgres://cdc@db:5432/app?sslmode=prefer", "falls back to plaintext"},
		{"postgres://cdc@db:5432/app?sslmode=allow", "unencrypted"},
		{"postgres://cdc@db:5432/app?sslmode=disable", "unencrypted"},
		{"postgres://cdc@db:5432/app?sslmode=require", "does not check the server's certificate"},
		{"host=db user=cdc sslmode=require", "does not check the server's certificate"},
		{"postgres://cdc@db:5432/app?sslmode=verify-full", ""},
		{"postgres://cdc@db:5432/app?sslmode=verify-ca", ""},
		{"postgres://cdc@%2Fvar%2Frun%2Fpostgresql/app", ""},
	} {
		ws := Config{URL: tt.url}.Weaknesses()
		got := strings.Join(ws, "; ")
		if tt.want == "" && got != "" || tt.want != "" && !strings.Contains(got, tt.want) {
			t.Errorf("%s: %q; want %q", tt.url, got, tt.want)
		}
		if strings.Contains(got, "cdc@") {
			t.Errorf("%s: the warning quotes the URL", tt.url)
		}
	}
}
