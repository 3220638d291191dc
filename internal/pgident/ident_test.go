package pgident

import "testing"

func TestParseQualified(t *testing.T) {
	type name struct{ schema, name string }
	tests := []struct {
		in      string
		want    name
		wantErr bool
	}{
		{in: "outbox", want: name{"public", "outbox"}},
		{in: "Public.OutBox", want: name{"public", "outbox"}},
		{in: `tenant."OutboxEvent"`, want: name{"tenant", "OutboxEvent"}},
		{in: `"My.Schema"."a""b"`, want: name{"My.Schema", `a"b`}},
		{in: "a.b.c", wantErr: true},
		{in: "", wantErr: true},
		{in: `"unterminated`, wantErr: true},
		{in: `a."b"c`, wantErr: true},
		{in: `.b`, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			schema, n, err := ParseQualified(tt.in)
			got := name{schema, n}
			if tt.wantErr {
				if err == nil {
					t.Fatalf("ParseQualified(%q) = %v, want an error", tt.in, got)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("ParseQualified(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
			}
		})
	}
}

func TestQuoteRoundTrip(t *testing.T) {
	for _, name := range []string{"outbox", "OutboxEvent", `a"b`, "tenantId", "x1", "1x", "with space"} {
		q := Quote(name)
		got, err := Parse(q)
		if err != nil || got != name {
			t.Errorf("Parse(Quote(%q)=%q) = %q, %v", name, q, got, err)
		}
	}
	if got := Qualified("tenant", "OutboxEvent"); got != `tenant."OutboxEvent"` {
		t.Errorf("Qualified = %s", got)
	}
}
