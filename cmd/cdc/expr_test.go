package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestCheckOfflineReportsExpressions: cdc check --offline compiles every
// table's filter and expressions, and names the table, the key and the
// column of what is wrong, on one line, with the configuration's exit code.
func TestCheckOfflineReportsExpressions(t *testing.T) {
	base := "postgres: {url: 'postgres://u@h/d'}\nkafka: {brokers: ['k:9092']}\ntables:\n  - name: public.outbox\n"
	var out, errOut bytes.Buffer
	good := writeConfig(t, base+"    filter: 'row.tenant != \"test\"'\n    expressions: {key: 'payload.customerId', headers: {x-region: 'payload.region'}}\n")
	if code := run(context.Background(), []string{"check", "--offline", "--config", good}, noEnv, &out, &errOut); code != 0 || !strings.HasPrefix(out.String(), "config OK: 1 outbox table(s)") {
		t.Fatalf("a good config: exit %d, stdout %q, stderr %q", code, out.String(), errOut.String())
	}
	out.Reset()
	bad := writeConfig(t, base+"    expressions: {topic: '\"orders.\" + payload.region.lower()'}\n")
	code := run(context.Background(), []string{"check", "--offline", "--config", bad}, noEnv, &out, &errOut)
	msg := strings.TrimSpace(errOut.String())
	if code != 2 || strings.Contains(msg, "\n") ||
		!strings.Contains(msg, "public.outbox: expressions.topic: column 33: undeclared reference to 'lower' (did you mean 'lowerAscii'?)") {
		t.Fatalf("a bad expression: exit %d, stderr %q", code, msg)
	}
}
