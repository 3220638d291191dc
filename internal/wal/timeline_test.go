package wal

import (
	"strings"
	"testing"

	"github.com/jackc/pglogrepl"
)

func TestTimelineEnd(t *testing.T) {
	const history = "1\t0/3000158\tno recovery target specified\n\n2\t0/5000A28\tat restore point \"x\"\n"
	for _, tt := range []struct {
		tli  int32
		want pglogrepl.LSN
		ok   bool
	}{
		{1, 0x3000158, true},
		{2, 0x5000A28, true},
		{3, 0, false},
	} {
		got, ok := timelineEnd(history, tt.tli)
		if got != tt.want || ok != tt.ok {
			t.Errorf("timelineEnd(%d) = %s, %v; want %s, %v", tt.tli, got, ok, tt.want, tt.ok)
		}
	}
}

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
