package outbox

import (
	"strings"
	"testing"
)

func exprTable(mod func(*Source)) *Source {
	t := &Source{Name: TableName{Schema: "public", Name: "outbox"}, Columns: DefaultColumns}
	mod(t)
	return t
}

// TestExpressionErrors: every start-time error of an expression names the
// table and the key, and, for one that does not compile, the column.
func TestExpressionErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(*Source)
		err  string
	}{
		{"syntax", func(s *Source) { s.Expressions.Key = `payload.customerId +` }, `public.outbox: expressions.key: column 21: Syntax error`},
		{"type", func(s *Source) { s.Filter = `row.tenant + 1 > "a"` }, `public.outbox: filter: column 16: found no matching overload for '_>_' applied to '(int, string)'`},
		{"header", func(s *Source) { s.Expressions.Headers = map[string]string{"x-region": `payload.region.upper()`} }, `public.outbox: expressions.headers.x-region: column 21: undeclared reference to 'upper' (did you mean 'upperAscii'?)`},
		{"partition type", func(s *Source) { s.Expressions.Partition = `row.shard + "1"` }, `public.outbox: expressions.partition: it gives string; it must give an int`},
		{"unmapped field", func(s *Source) { s.Expressions.Topic = `"orders." + tenant` }, `public.outbox: expressions.topic reads tenant, but that field is not mapped to a column`},
		{"unmapped timestamp", func(s *Source) { s.Filter = `timestamp > commit_time` }, `public.outbox: filter reads timestamp, but that field is not mapped`},
		{"topic twice", func(s *Source) { s.Topic = "orders"; s.Expressions.Topic = `"orders"` }, `public.outbox: topic and expressions.topic are both set`},
		{"key twice", func(s *Source) { s.Key = "{id}"; s.Expressions.Key = `id` }, `public.outbox: key and expressions.key are both set`},
		{"nameless header", func(s *Source) { s.Expressions.Headers = map[string]string{"": `"x"`} }, `public.outbox: expressions.headers: a header needs a name`},
		{"slow", func(s *Source) {
			s.Filter = `payload.a.all(x, payload.b.all(y, payload.c.exists(z, z == x + y)))`
		}, `public.outbox: filter: its estimated cost on an event of 1000-byte strings`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := exprTable(tc.mod).Validate()
			if err == nil || !strings.HasPrefix(err.Error(), tc.err) {
				t.Fatalf("Validate() = %v, want an error starting %q", err, tc.err)
			}
		})
	}
}

// TestExpressionsReadTheirColumns: the columns the expressions read from
// row are extracted (Extra), after the template's, each once; the
// templates an expression replaces are gone; Validate stays idempotent.
func TestExpressionsReadTheirColumns(t *testing.T) {
	tbl := exprTable(func(s *Source) {
		s.Topic = "{column:kind}.events"
		s.Filter = `row.tenant != "test" && row["tenant"] != "demo"`
		s.Expressions = Expressions{Key: `payload.customerId`, Headers: map[string]string{"x-pair": `row.kind + "/" + row.region`}}
	})
	for i := 0; i < 2; i++ {
		if err := tbl.Validate(); err != nil {
			t.Fatal(err)
		}
		if strings.Join(tbl.Extra, ",") != "kind,tenant,region" {
			t.Fatalf("Validate #%d: Extra %q", i+1, tbl.Extra)
		}
		p := tbl.Programs
		if p == nil || p.Filter == nil || p.Key == nil || p.Topic != nil || len(p.Headers) != 1 || !p.Payload {
			t.Fatalf("Validate #%d: programs %+v", i+1, p)
		}
		want := []RowColumn{{"tenant", 1}, {"kind", 0}, {"region", 2}}
		if len(p.Row) != len(want) {
			t.Fatalf("row columns %+v", p.Row)
		}
		for j := range want {
			if p.Row[j] != want[j] {
				t.Errorf("row column %d: %+v, want %+v", j, p.Row[j], want[j])
			}
		}
		if strings.Join(p.PayloadMembers, ",") != "customerId" {
			t.Errorf("Validate #%d: payload members %q", i+1, p.PayloadMembers)
		}
		if tbl.Key != "" || len(tbl.KeyTemplate.Parts) != 0 {
			t.Errorf("the key expression left the key template %q (%d parts)", tbl.Key, len(tbl.KeyTemplate.Parts))
		}
	}
	plain := exprTable(func(*Source) {})
	if err := plain.Validate(); err != nil {
		t.Fatal(err)
	}
	if plain.Programs != nil || plain.Key != DefaultKey || plain.Topic != DefaultTopic {
		t.Errorf("a table without expressions: programs %v, key %q, topic %q", plain.Programs, plain.Key, plain.Topic)
	}
	whole := exprTable(func(s *Source) {
		s.Filter = `payload.kind != "x"`
		s.Expressions.Headers = map[string]string{"x-n": `string(size(payload))`}
	})
	if err := whole.Validate(); err != nil {
		t.Fatal(err)
	}
	if !whole.Programs.Payload || whole.Programs.PayloadMembers != nil {
		t.Errorf("one expression reads the payload whole: members %q, want nil (the whole parsed)", whole.Programs.PayloadMembers)
	}
	topical := exprTable(func(s *Source) { s.Expressions.Topic = `"orders." + aggregate_type` })
	if err := topical.Validate(); err != nil {
		t.Fatal(err)
	}
	if !topical.TopicFromRow() || topical.LiteralTopic() != "" || len(topical.FixedTopics()) != 0 {
		t.Errorf("an expression topic: from the row %v, literal %q, fixed %q", topical.TopicFromRow(), topical.LiteralTopic(), topical.FixedTopics())
	}
}
