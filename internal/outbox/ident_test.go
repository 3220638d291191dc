package outbox

import "testing"

func TestParseTableName(t *testing.T) {
	tests := []struct {
		in      string
		want    TableName
		wantErr bool
	}{
		{in: "outbox", want: TableName{"public", "outbox"}},
		{in: "Public.OutBox", want: TableName{"public", "outbox"}},
		{in: `tenant."OutboxEvent"`, want: TableName{"tenant", "OutboxEvent"}},
		{in: `"My.Schema"."a""b"`, want: TableName{"My.Schema", `a"b`}},
		{in: "a.b.c", wantErr: true},
		{in: "", wantErr: true},
		{in: `"unterminated`, wantErr: true},
		{in: `a."b"c`, wantErr: true},
		{in: `.b`, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseTableName(tt.in)
			if tt.wantErr {
				if err == nil {
					t.Fatalf("ParseTableName(%q) = %v, want an error", tt.in, got)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("ParseTableName(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
			}
		})
	}
}

func TestQuoteIdentRoundTrip(t *testing.T) {
	for _, name := range []string{"outbox", "OutboxEvent", `a"b`, "tenantId", "x1", "1x", "with space"} {
		q := QuoteIdent(name)
		got, err := ParseIdent(q)
		if err != nil || got != name {
			t.Errorf("ParseIdent(QuoteIdent(%q)=%q) = %q, %v", name, q, got, err)
		}
	}
	if got := (TableName{"tenant", "OutboxEvent"}).String(); got != `tenant."OutboxEvent"` {
		t.Errorf("String() = %s", got)
	}
}
