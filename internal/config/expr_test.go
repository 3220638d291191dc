package config

import (
	"strings"
	"testing"
)

// TestLoadExpressions: tables[].filter and .expressions reach the table,
// compiled, with the columns they read extracted.
func TestLoadExpressions(t *testing.T) {
	p := writeConfig(t, `
postgres: {url: 'postgres://u@h/d'}
kafka: {brokers: [k:1]}
tables:
  - name: public.outbox
    filter: 'row.tenant != "test"'
    expressions:
      key: 'payload.customerId'
      topic: '"orders." + payload.region'
      partition: 'int(row.shard)'
      headers: {x-region: 'payload.region'}
`)
	cfg, _, err := validConfig(p, env())
	if err != nil {
		t.Fatal(err)
	}
	tbl := cfg.Tables[0]
	x := tbl.Programs
	if x == nil || x.Filter == nil || x.Topic == nil || x.Key == nil || x.Partition == nil || len(x.Headers) != 1 || x.Headers[0].Name != "x-region" {
		t.Fatalf("programs %+v", x)
	}
	if x.Key.Text != "payload.customerId" || !x.Payload || strings.Join(tbl.Extra, ",") != "tenant,shard" {
		t.Errorf("key %q, payload %v, extra %q", x.Key.Text, x.Payload, tbl.Extra)
	}
	if tbl.Topic != "" || tbl.Key != "" {
		t.Errorf("the templates the expressions replace: topic %q key %q", tbl.Topic, tbl.Key)
	}
}

// TestExpressionConfigErrors: what is wrong with an expression stops the
// start, and cdc check --offline, with one line that names the table, the
// key and where in the expression.
func TestExpressionConfigErrors(t *testing.T) {
	base := "postgres: {url: 'postgres://u@h/d'}\nkafka: {brokers: [k:1]}\ntables:\n  - name: public.outbox\n"
	for _, tc := range []struct{ name, body, want string }{
		{"syntax", "    expressions: {key: 'payload.customerId +'}\n", "public.outbox: expressions.key: column 21: Syntax error"},
		{"type", "    filter: 'row.tenant + 1'\n", "public.outbox: filter: it gives int; it must give a bool"},
		{"unknown variable", "    expressions: {topic: '\"orders.\" + paylod.region'}\n", "public.outbox: expressions.topic: column 13: undeclared reference to 'paylod' (did you mean 'payload'?)"},
		{"unmapped field", "    expressions: {headers: {x-t: 'tenant'}}\n", "public.outbox: expressions.headers.x-t reads tenant, but that field is not mapped to a column"},
		{"topic and its expression", "    topic: orders\n    expressions: {topic: '\"orders\"'}\n", "public.outbox: topic and expressions.topic are both set"},
		{"key and its expression", "    key: '{id}'\n    expressions: {key: 'id'}\n", "public.outbox: key and expressions.key are both set"},
		{"header name taken", "    expressions: {headers: {event_type: 'payload.kind'}}\n", "public.outbox: expressions.headers.event_type: the table already sends a header event_type"},
		{"slow", "    filter: 'payload.a.all(x, payload.b.all(y, payload.c.exists(z, z == x + y)))'\n", "public.outbox: filter: its estimated cost on an event of 1000-byte strings and 1000-element lists is"},
		{"unknown key", "    expressions: {partitoin: '1'}\n", "unknown key tables[0].expressions.partitoin (line 5); did you mean partition?"},
		{"subjects a row chooses", "    schema: {format: avro, file: order.avsc}\n    expressions: {topic: '\"orders.\" + payload.region'}\nschema_registry: {url: 'http://registry:8081', auto_register: true}\n",
			`public.outbox: schema_registry.auto_register with a topic that a row's fields choose (expressions.topic "orders." + payload.region)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := validConfig(writeConfig(t, base+tc.body), env())
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to mention %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("err = %q: want one line", err)
			}
		})
	}
}
