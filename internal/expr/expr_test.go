package expr

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"cel.dev/cel-go/interpreter"
	"github.com/twmb/franz-go/pkg/kgo"
)

var fields = []string{"id", "aggregate_type", "aggregate_id", "event_type", "payload", "timestamp", "version", "tenant", "traceparent"}

func newEnv(t *testing.T) *Env {
	t.Helper()
	e, err := NewEnv(fields)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func vars(t *testing.T, m map[string]any) Activation {
	t.Helper()
	a, err := interpreter.NewActivation(m)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestCompileErrors: each start-time error says where in the expression,
// on one line, what is wrong.
func TestCompileErrors(t *testing.T) {
	e := newEnv(t)
	for _, tc := range []struct {
		name, text string
		want       Want
		err        string
	}{
		{"syntax", `payload.region +`, WantString, "column 17: Syntax error"},
		{"undeclared", `paylod.region`, WantString, "column 1: undeclared reference to 'paylod' (did you mean 'payload'?)"},
		{"type", `commit_lsn + 1`, WantString, "column 12: found no matching overload for '_+_' applied to '(string, int)'"},
		{"result type", `"3"`, WantInt, "it gives string; it must give an int"},
		{"filter result", `payload.region + "x"`, WantBool, "it gives string; it must give a bool"},
		{"null key", `null`, WantString, "it gives null_type; it must give a string"},
		{"typed or null", `has(payload.region) ? payload.region.lowerAscii() : null`, WantHeader, "(make the other side dyn: cond ? dyn(value) : null)"},
		{"row whole", `size(row) > 2`, WantBool, "column 6: read row one column at a time"},
		{"row dynamic", `row[payload.column] == "x"`, WantBool, "column 1: read row one column at a time"},
		{"shadowing", `payload.items.exists(row, row == "x")`, WantBool, "the iteration variable row hides the variable of that name"},
		{"clock", `now() > commit_time`, WantBool, "undeclared reference to 'now'"},
		{"env", `env("HOME")`, WantString, "undeclared reference to 'env'"},
		{"empty", `  `, WantString, "the expression is empty"},
		{"second line", "payload.region\n  + tenat", WantString, "line 2, column 5: undeclared reference to 'tenat'"},
		// Written to be slow: a comprehension inside another.
		{"slow", `payload.a.all(x, payload.b.all(y, payload.c.exists(z, z == x + y)))`, WantBool, "its estimated cost on an event of 1000-byte strings and 1000-element lists is"},
		// Lists of the event's members compared whole: how deep they are
		// is not known, and so neither is what comparing them costs.
		{"unbounded", `[payload.a] == [payload.b]`, WantBool, "its cost has no bound: it computes a value of unknown size"},
		// What no estimate bounds (exprcost.Check), where it is.
		{"row's pattern", `payload.s.matches(payload.p)`, WantBool, "column 26: matches() takes a pattern written in the expression"},
		{"bad pattern", `payload.s.matches("a(")`, WantBool, "column 19: matches(): its pattern does not compile: error parsing regexp: missing closing )"},
		{"computed key in a loop", `payload.l.exists(x, payload.m[x] == 1)`, WantBool, "column 31: an index or a map literal with a key computed from the event, inside a comprehension"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.Compile(tc.text, tc.want)
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("Compile(%q) = %v, want an error containing %q", tc.text, err, tc.err)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("the error is not one line: %q", err)
			}
		})
	}
}

// TestReferences: what a program reads is known before any event.
func TestReferences(t *testing.T) {
	e := newEnv(t)
	p, err := e.Compile(`row.tenant != "test" && has(row.region) && row["x-group"] == aggregate_type && payload.total > 1 && commit_time > timestamp("2020-01-01T00:00:00Z") && payload.items.all(i, i > 0) && tenant != "t"`, WantBool)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(p.Row, []string{"tenant", "region", "x-group"}) {
		t.Errorf("row columns %q", p.Row)
	}
	if !slices.Equal(p.Fields, []string{"aggregate_type", "tenant"}) {
		t.Errorf("fields %q", p.Fields)
	}
	if !p.Payload || !slices.Equal(p.PayloadMembers, []string{"total", "items"}) {
		t.Errorf("payload read %v, its members %q", p.Payload, p.PayloadMembers)
	}
	whole, err := e.Compile(`payload.total > 1 && size(payload) > 1`, WantBool)
	if err != nil {
		t.Fatal(err)
	}
	if !whole.Payload || whole.PayloadMembers != nil {
		t.Errorf("payload read whole: members %q, want nil", whole.PayloadMembers)
	}
	q, err := e.Compile(`"orders." + aggregate_type`, WantString)
	if err != nil {
		t.Fatal(err)
	}
	if q.Payload || len(q.Row) != 0 || !slices.Equal(q.Fields, []string{"aggregate_type"}) {
		t.Errorf("a field-only expression reads payload %v, row %q, fields %q", q.Payload, q.Row, q.Fields)
	}
}

// TestEvaluate: each kind of expression gives its type, or an error that
// says what it gave instead.
func TestEvaluate(t *testing.T) {
	e := newEnv(t)
	commit := time.Date(2026, 1, 30, 12, 0, 0, 0, time.UTC)
	a := vars(t, map[string]any{
		Row:            map[string]any{"tenant": "acme", "shard": int64(3), "note": nil},
		Payload:        map[string]any{"customerId": "c-42", "region": "EU", "n": 7.0},
		"tenant":       nil,
		"aggregate_id": "agg-1",
		CommitLSN:      "0/16B3748",
		CommitTime:     commit,
	})
	for _, tc := range []struct {
		text string
		want Want
		got  any // string, bool, int64, nil (a null header)
		err  string
	}{
		{`row.tenant != "test"`, WantBool, true, ""},
		{`tenant != "test"`, WantBool, true, ""}, // a NULL is null, which is not "test"
		{`payload.customerId`, WantString, "c-42", ""},
		{`"orders." + payload.region.lowerAscii()`, WantString, "orders.eu", ""},
		{`aggregate_id + ":" + commit_lsn`, WantString, "agg-1:0/16B3748", ""},
		{`row.shard`, WantInt, int64(3), ""},
		{`int(payload.n) % 2`, WantInt, int64(1), ""},
		{`has(payload.zone) ? payload.zone : null`, WantHeader, nil, ""},
		{`commit_time.getHours()`, WantInt, int64(12), ""},
		// What is computed has a size too: cel-go alone took this one as
		// unbounded, and Compile refused it.
		{`"agg-" + string(int(payload.n) % 1000)`, WantString, "agg-7", ""},
		{`payload.region.split("").all(c, c != "x")`, WantBool, true, ""},
		{`payload.zone`, WantString, nil, "no such key: zone"},
		{`payload.n`, WantString, nil, "it gave double, not a string"},
		{`payload.n`, WantInt, nil, "it gave double, not an int"},
		{`row.note`, WantString, nil, "it gave null_type, not a string"},
		{`"x-" + tenant`, WantHeader, nil, "no such overload"},
		{`payload.customerId`, WantBool, nil, "it gave string, not a bool"},
	} {
		t.Run(tc.text, func(t *testing.T) {
			p, err := e.Compile(tc.text, tc.want)
			if err != nil {
				t.Fatal(err)
			}
			var got any
			switch tc.want {
			case WantBool:
				got, err = p.Bool(a, 200)
			case WantInt:
				got, err = p.Int(a, 200)
			default:
				var s string
				var ok bool
				s, ok, err = p.String(a, 200)
				if ok {
					got = s
				}
			}
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %v, %v; want an error containing %q", got, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.got {
				t.Fatalf("got %#v, %v; want %#v", got, err, tc.got)
			}
		})
	}
}

// TestCostLimitAtRunTime: an expression that passes the estimate on an
// event of AssumedSize, given an event far larger, stops at CostLimit with
// ErrCost instead of running on.
func TestCostLimitAtRunTime(t *testing.T) {
	e := newEnv(t)
	p, err := e.Compile(`payload.items.all(i, i > 0)`, WantBool)
	if err != nil {
		t.Fatal(err)
	}
	if p.Cost == 0 || p.Cost > MaxEstimatedCost {
		t.Fatalf("estimated cost %d", p.Cost)
	}
	if ok, err := p.Bool(items(t, AssumedSize)); !ok || err != nil {
		t.Fatalf("on an event of the assumed size: %v, %v", ok, err)
	}
	if _, err := p.Bool(items(t, 1000*AssumedSize)); !errors.Is(err, ErrCost) {
		t.Fatalf("on an event a thousand times larger: %v, want ErrCost", err)
	}
}

// items is an event whose payload holds a list of n ints, as JSON would
// (two bytes each), and its size.
func items(t *testing.T, n int) (Activation, int) {
	l := make([]any, n)
	for i := range l {
		l[i] = int64(1)
	}
	return vars(t, map[string]any{Payload: map[string]any{"items": l}}), 64 + 2*n + len(`{"items": []}`)
}

// TestCostCountedWhereItCanReachTheLimit: an evaluation counts its cost
// only on an event larger than the estimate says can stay within
// CostLimit; on the largest event it does not count on, counted, it stays
// within the limit, so skipping the count skips nothing.
func TestCostCountedWhereItCanReachTheLimit(t *testing.T) {
	e := newEnv(t)
	for _, text := range []string{`payload.items.all(i, i > 0)`, `payload.items.exists(i, i == 7)`, `payload.items.map(i, i * 2).size() > 0`} {
		p, err := e.Compile(text, WantBool)
		if err != nil {
			t.Fatal(err)
		}
		if p.fastUpTo < AssumedSize || p.fast == nil {
			t.Fatalf("%s: untracked up to %d bytes", text, p.fastUpTo)
		}
		a, _ := items(t, p.fastUpTo/2)
		v, det, err := p.prg.Eval(a)
		if err != nil || det.ActualCost() == nil || *det.ActualCost() > CostLimit {
			t.Fatalf("%s on an event of %d bytes, counted: %v, cost %v, %v; want within %d", text, p.fastUpTo, v, *det.ActualCost(), err, CostLimit)
		}
		t.Logf("%s: estimated %d on %d bytes, counted only past %d bytes", text, p.Cost, AssumedSize, p.fastUpTo)
	}
}

// TestPartitionFor: partitionFor(key, n) is the partition Kafka's default
// partitioner (franz-go's, as the Java client's) gives key among n.
func TestPartitionFor(t *testing.T) {
	e := newEnv(t)
	p, err := e.Compile(`partitionFor(payload.customerId, 12)`, WantInt)
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"", "a", "ab", "abc", "c-42", "customer-00017", "ünïcødé ✓"} {
		want := kgo.StickyKeyPartitioner(nil).ForTopic("t").Partition(&kgo.Record{Key: []byte(key)}, 12)
		got, err := p.Int(vars(t, map[string]any{Payload: map[string]any{"customerId": key}}), 200)
		if err != nil || got != int64(want) {
			t.Errorf("partitionFor(%q, 12) = %d, %v; Kafka's partitioner says %d", key, got, err, want)
		}
	}
	zero, err := e.Compile(`partitionFor("k", 0)`, WantInt)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := zero.Int(vars(t, map[string]any{}), 200); err == nil || !strings.Contains(err.Error(), "a topic has at least 1") {
		t.Errorf("partitionFor(k, 0): %v", err)
	}
}
