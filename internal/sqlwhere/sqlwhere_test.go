package sqlwhere

import (
	"strings"
	"testing"
)

// TestCheck (issue 24): a condition stays inside its WHERE: it may
// not close a parenthesis it did not open, end the statement or comment
// out the rest, outside literals and quoted names, which may hold anything.
func TestCheck(t *testing.T) {
	for _, tt := range []struct {
		where string
		bad   string // "" when accepted
	}{
		{"", ""},
		{"published_at IS NULL", ""},
		{"(a = 1 OR b = 2) AND c IN (1, 2)", ""},
		{"note = 'it''s ); -- /* fine'", ""},
		{`"we;ird)" = 1`, ""},
		{"body = $$ ) ; -- $$", ""},
		{"body = $x$ ) $x$", ""},
		{"note = E'\\' ) '", ""},
		{"true) --", "closes a parenthesis"},
		{"true) OR (true", "closes a parenthesis"},
		{"true; DELETE FROM outbox", "contains ';'"},
		{"true -- and the rest", "comment"},
		{"true /* and the rest */", "comment"},
		{"(true", "parenthesis open"},
		{"note = 'open", "not closed"},
		{`"open = 1`, "not closed"},
		{"body = $$ open", "not closed"},
	} {
		err := Check(tt.where)
		switch {
		case tt.bad == "" && err != nil:
			t.Errorf("Check(%q) = %v; want it accepted", tt.where, err)
		case tt.bad != "" && (err == nil || !strings.Contains(err.Error(), tt.bad)):
			t.Errorf("Check(%q) = %v; want an error saying %q", tt.where, err, tt.bad)
		}
	}
}

// TestCheckLexes (issue 37): the condition is read as
// PostgreSQL's lexer reads it. A quote after an identifier that merely
// ends in e is a plain string, where a backslash escapes nothing, so the
// parenthesis after it is outside any string and closes the WHERE: refused
// (the old check took it for an E” string and let the rest of the
// statement through). Calls of functions that act outside the read-only
// transaction are refused, bare or qualified with pg_catalog.
func TestCheckLexes(t *testing.T) {
	for _, tt := range []struct {
		where string
		bad   string
	}{
		{`name'\' IS NOT NULL ) UNION ALL SELECT 1 WHERE (true /* ' */`, "closes a parenthesis"},
		{`namE'\' ) OR (true`, "closes a parenthesis"},
		{`note = e'it\'s ) fine'`, ""},
		{`note = E'\\' AND (a = 1)`, ""},
		{`note = U&'d\0061t\+000061' AND b = X'1F'`, ""},
		{`U&"we)ird" = 1`, ""},
		{`a$b$ = 1`, ""},
		{`x = $1 AND (y = $2)`, ""},
		{`n = 1.5 AND m = .5`, ""},
		{`pg_terminate_backend(pg_backend_pid()) IS NOT NULL`, "calls pg_terminate_backend"},
		{`true AND PG_CATALOG . "pg_drop_replication_slot" ('outbox_cdc') IS NULL`, "calls pg_drop_replication_slot"},
		{`pg_catalog.set_config('search_path', 'evil', false) IS NOT NULL`, "calls set_config"},
		{`(SELECT pg_notify('c', 'x')) IS NULL`, "calls pg_notify"},
		{`pg_sleep (10) IS NULL`, "calls pg_sleep"},
		{`myschema.pg_sleep(1) IS NULL`, ""}, // someone's own function, not the builtin
		{`created_at > now() - interval '1 day' AND lower(aggregatetype) = 'order'`, ""},
		{`'pg_sleep(' = note`, ""},
	} {
		err := Check(tt.where)
		switch {
		case tt.bad == "" && err != nil:
			t.Errorf("Check(%q) = %v; want it accepted", tt.where, err)
		case tt.bad != "" && (err == nil || !strings.Contains(err.Error(), tt.bad)):
			t.Errorf("Check(%q) = %v; want an error saying %q", tt.where, err, tt.bad)
		}
	}
}

// FuzzCheck: whatever the condition, once accepted, placed in
// its WHERE it leaves the parentheses balanced outside strings, and holds
// no statement end: checked by lexing the whole statement again.
func FuzzCheck(f *testing.F) {
	for _, s := range []string{"a = 1", `note = E'\'' `, "$$x$$", `U&"a" = 1`, `name'\' ) (`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, where string) {
		if Check(where) != nil {
			return
		}
		if err := Check("(\n" + where + "\n) AND (k) > (1)"); err != nil {
			t.Fatalf("accepted %q, but placed in its WHERE: %v", where, err)
		}
	})
}
