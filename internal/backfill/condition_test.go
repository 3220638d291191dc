package backfill

import (
	"strings"
	"testing"
)

// TestCheckCondition (issue 24): a condition stays inside its WHERE: it may
// not close a parenthesis it did not open, end the statement or comment
// out the rest, outside literals and quoted names, which may hold anything.
func TestCheckCondition(t *testing.T) {
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
		err := CheckCondition(tt.where)
		switch {
		case tt.bad == "" && err != nil:
			t.Errorf("CheckCondition(%q) = %v; want it accepted", tt.where, err)
		case tt.bad != "" && (err == nil || !strings.Contains(err.Error(), tt.bad)):
			t.Errorf("CheckCondition(%q) = %v; want an error saying %q", tt.where, err, tt.bad)
		}
	}
}
