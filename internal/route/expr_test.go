package route

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/sink"
)

// seed000 is seed 000's events table: organization_id as the tenant, a
// jsonb payload; its topic and key, unless expressions compute them, are
// static.
func seed000(mod func(*outbox.Source)) *outbox.Source {
	return table(func(t *outbox.Source) {
		t.Columns = outbox.Columns{outbox.FieldID: "event_id", outbox.FieldEventType: "type", outbox.FieldPayload: "payload", outbox.FieldTenant: "organization_id"}
		mod(t)
		if t.Expressions.Topic == "" {
			t.Topic = "practice.events"
		}
		if t.Expressions.Key == "" {
			t.Key = "{id}"
		}
	})
}

func seedEvent(t *outbox.Source, payload string, extra map[string]outbox.Value) *outbox.Event {
	ev := &outbox.Event{Source: t, CommitLSN: 0x16B3748, CommitTime: commitTime, Extra: make([]outbox.Value, len(t.Extra))}
	ev.Fields[outbox.FieldID] = text("e-1")
	ev.Fields[outbox.FieldEventType] = text("practice.created")
	ev.Fields[outbox.FieldTenant] = text("org-9")
	ev.Fields[outbox.FieldPayload] = outbox.Value{B: []byte(payload), Kind: outbox.KindJSON}
	for name, v := range extra {
		ev.Extra[t.ExtraIndex(name)] = v
	}
	return ev
}

// TestExpressionRecord: each kind of expression shapes the record: the
// topic and key computed from the payload, a header from two columns, the
// partition pinned; the payload's bytes and the metadata headers as
// without them.
func TestExpressionRecord(t *testing.T) {
	tbl := seed000(func(t *outbox.Source) {
		t.Expressions = outbox.Expressions{
			Topic:     `"practice." + payload.region.lowerAscii()`,
			Key:       `payload.customerId`,
			Partition: `row.shard % 4`,
			Headers:   map[string]string{"x-actor": `row.actor_type + ":" + string(row.actor_id)`, "x-zone": `has(payload.zone) ? payload.zone : null`},
		}
	})
	payload := `{"region": "EU", "customerId": "c-42", "big": 9007199254740993}`
	ev := seedEvent(tbl, payload, map[string]outbox.Value{
		"shard":      {B: []byte("7"), Kind: outbox.KindNumber},
		"actor_type": text("user"),
		"actor_id":   {B: []byte("12"), Kind: outbox.KindNumber},
	})
	rec := record(t, tbl, ev)
	if rec.Topic != "practice.eu" || string(rec.Key) != "c-42" || string(rec.Value) != payload {
		t.Errorf("record topic %q key %q value %q", rec.Topic, rec.Key, rec.Value)
	}
	if !sink.Pinned(rec) || rec.Partition != 3 {
		t.Errorf("partition %d (pinned %v), want 3 pinned", rec.Partition, sink.Pinned(rec))
	}
	wantHeaders(t, rec, map[string]string{"id": "e-1", "event_type": "practice.created", "tenant": "org-9", "commit_lsn": "0/16B3748", "x-actor": "user:12"})

	// A large integer keeps its digits: a double would not.
	tbl2 := seed000(func(t *outbox.Source) { t.Expressions.Key = `string(payload.customerId)` })
	if rec := record(t, tbl2, seedEvent(tbl2, `{"customerId": 9007199254740993}`, nil)); string(rec.Key) != "9007199254740993" || sink.Pinned(rec) {
		t.Errorf("key %q, pinned %v", rec.Key, sink.Pinned(rec))
	}
}

// TestNumericColumnPastADouble: a numeric column too large for a double
// (a numeric of 400 digits) is no value an expression reads, not even its
// text: one that reads it makes the event invalid, saying why.
func TestNumericColumnPastADouble(t *testing.T) {
	tbl := seed000(func(t *outbox.Source) { t.Expressions.Partition = `row.shard > 0 ? 1 : 0` })
	r, err := New([]*outbox.Source{tbl})
	if err != nil {
		t.Fatal(err)
	}
	huge := outbox.Value{B: []byte("1" + strings.Repeat("0", 400)), Kind: outbox.KindNumber}
	_, err = r.Record(seedEvent(tbl, `{}`, map[string]outbox.Value{"shard": huge}))
	var ee *outbox.EventError
	if want := "failed: the number 10000000000000000000... (401 characters) is too large for a double"; !errors.As(err, &ee) || !strings.Contains(err.Error(), want) {
		t.Errorf("%v; want an EventError: %s", err, want)
	}
}

// TestTableWithoutExpressionsIsUnpinned: a table without expressions
// leaves the partition to the producer.
func TestTableWithoutExpressionsIsUnpinned(t *testing.T) {
	rec := record(t, table(nil), nil)
	if sink.Pinned(rec) {
		t.Fatal("a record of a table without expressions is pinned")
	}
}

// TestFilter: an event the filter gives false for is ErrFiltered, one it
// gives true for a record; a NULL tenant is null, which is not "test".
func TestFilter(t *testing.T) {
	tbl := seed000(func(t *outbox.Source) { t.Filter = `tenant != "test" && row.actor_type != "cron"` })
	r, err := New([]*outbox.Source{tbl})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		tenant, actor string
		keep          bool
	}{
		{"org-1", "user", true}, {"test", "user", false}, {"org-1", "cron", false}, {"", "user", true},
	} {
		ev := seedEvent(tbl, `{}`, map[string]outbox.Value{"actor_type": text(tc.actor)})
		ev.Fields[outbox.FieldTenant] = text(tc.tenant)
		if tc.tenant == "" {
			ev.Fields[outbox.FieldTenant] = outbox.Value{}
		}
		rec, err := r.Record(ev)
		switch {
		case tc.keep && (err != nil || rec == nil):
			t.Errorf("tenant %q actor %q: %v, want a record", tc.tenant, tc.actor, err)
		case !tc.keep && (rec != nil || !errors.Is(err, ErrFiltered)):
			t.Errorf("tenant %q actor %q: %v, %v; want ErrFiltered", tc.tenant, tc.actor, rec, err)
		}
	}
}

// TestExpressionFailuresAreInvalidEvents: whatever a row makes an
// expression do at run time is an *outbox.EventError naming the event and
// the expression: a missing member, a wrong type, a payload that is not
// JSON or holds a number past a double, an illegal topic, a partition
// below 0, the cost limit; and a dead letter for it keeps what can still
// be worked out.
func TestExpressionFailuresAreInvalidEvents(t *testing.T) {
	for _, tc := range []struct {
		name    string
		x       outbox.Expressions
		filter  string
		payload string
		err     string
	}{
		{"missing member", outbox.Expressions{Key: `payload.customerId`}, "", `{"region": "eu"}`, `its expressions.key (payload.customerId) failed: no such key: customerId`},
		{"wrong type", outbox.Expressions{Key: `payload.customerId`}, "", `{"customerId": 42}`, `failed: it gave int, not a string`},
		{"filter type", outbox.Expressions{}, `payload.keep`, `{"keep": "yes"}`, `its filter (payload.keep) failed: it gave string, not a bool`},
		{"not json", outbox.Expressions{Key: `payload.customerId`}, "", `not json`, `the table's expressions read payload, and its payload is not JSON they can read`},
		{"number past a double", outbox.Expressions{Key: `payload.customerId`}, "", `{"customerId": "c", "n": 1e999}`, `its payload is not JSON they can read: the number 1e999 is too large for a double`},
		{"number past a double, whole", outbox.Expressions{Key: `string(size(payload))`}, "", `{"l": [-1E400]}`, `its payload is not JSON they can read: the number -1E400 is too large for a double`},
		{"illegal topic", outbox.Expressions{Topic: `"orders/" + payload.region`}, "", `{"region": "eu"}`, `topic name "orders/eu" contains '/'`},
		{"partition below 0", outbox.Expressions{Partition: `int(payload.p)`}, "", `{"p": -1}`, `gave -1, which is no partition`},
		{"header type", outbox.Expressions{Headers: map[string]string{"x-n": `payload.n`}}, "", `{"n": 1.5}`, `its expressions.headers.x-n (payload.n) failed: it gave double, not a string or null`},
		{"cost", outbox.Expressions{Headers: map[string]string{"x-all": `payload.items.all(i, i > 0) ? "all" : "some"`}}, "", `{"items": [` + strings.Repeat("1,", 400_000) + `1]}`, `reached the cost limit of 1000000 for one event`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tbl := table(func(t *outbox.Source) {
				t.Expressions = tc.x
				t.Filter = tc.filter
				t.OnInvalid = outbox.OnInvalidDeadLetter
			})
			r, err := New([]*outbox.Source{tbl})
			if err != nil {
				t.Fatal(err)
			}
			ev := event(tbl)
			ev.Fields[outbox.FieldPayload].B = []byte(tc.payload)
			_, err = r.Record(ev)
			var ee *outbox.EventError
			if !errors.As(err, &ee) || !strings.Contains(err.Error(), tc.err) || ee.EventID != "e-1" {
				t.Fatalf("Record: %v; want an EventError of e-1 containing %q", err, tc.err)
			}
			dl := r.DeadLetter(ev, ee.Brief())
			if dl.Topic != tbl.DeadLetterTopic || string(dl.Value) != tc.payload || headers(dl)[HeaderDeadLetterID] != "e-1" {
				t.Errorf("dead letter topic %q value %.40q headers %v", dl.Topic, dl.Value, headers(dl))
			}
		})
	}
}

// TestExpressionTopicBound: a topic an expression computes from the row is
// bound by max_topics, as a template's is.
func TestExpressionTopicBound(t *testing.T) {
	tbl := table(func(t *outbox.Source) { t.Expressions.Topic = `"events." + payload.kind`; t.MaxTopics = 3 })
	r, err := New([]*outbox.Source{tbl})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 50; i++ {
		ev := event(tbl)
		ev.Fields[outbox.FieldPayload].B = []byte(`{"kind": "k` + strconv.Itoa(i) + `"}`)
		rec, err := r.Record(ev)
		if i < 3 && (err != nil || rec.Topic != "events.k"+strconv.Itoa(i)) || i >= 3 && (err == nil || !strings.Contains(err.Error(), "tables[].max_topics (3)")) {
			t.Fatalf("kind %d: %v, %v", i, rec, err)
		}
	}
}

// TestExpressionHeaderNames: an expression header may not take the name
// of a header the table already sends, or one of the connector's on a
// dead letter or a parked record (a redrive reads those back); nor may an
// additional column's.
func TestExpressionHeaderNames(t *testing.T) {
	for name, want := range map[string]string{
		"event_type":        "the table already sends a header event_type",
		"x-group":           "the table already sends a header x-group",
		"dead_letter_error": "names starting with dead_letter_ are the connector's",
		"parked_partition":  "names starting with parked_ are the connector's",
		"parked_seq":        "names starting with parked_ are the connector's",
	} {
		tbl := table(func(t *outbox.Source) {
			t.Additional = []outbox.Additional{{Column: "group_id", Placement: outbox.PlaceHeader, As: "x-group"}}
			t.Expressions.Headers = map[string]string{name: `"v"`}
		})
		if _, err := New([]*outbox.Source{tbl}); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("header %s: %v; want %q", name, err, want)
		}
	}
}

func TestAdditionalHeaderNamesReserved(t *testing.T) {
	tbl := table(func(t *outbox.Source) {
		t.Additional = []outbox.Additional{{Column: "group_id", Placement: outbox.PlaceHeader, As: "parked_episode"}}
	})
	if _, err := New([]*outbox.Source{tbl}); err == nil || !strings.Contains(err.Error(), "names starting with parked_ are the connector's") {
		t.Errorf("an additional column's header parked_episode: %v; want it refused", err)
	}
}

// TestPayloadReadWhole: with an expression that reads the payload as a
// whole, it is parsed whole, and the others read it as well.
func TestPayloadReadWhole(t *testing.T) {
	tbl := table(func(t *outbox.Source) {
		t.Key = ""
		t.Expressions = outbox.Expressions{Key: `payload.customerId`, Headers: map[string]string{"x-members": `string(size(payload))`}}
	})
	ev := event(tbl)
	ev.Fields[outbox.FieldPayload].B = []byte(`{"a": [1, 2], "customerId": "c-9", "z": {"y": null}}`)
	rec := record(t, tbl, ev)
	if string(rec.Key) != "c-9" || headers(rec)["x-members"] != "3" {
		t.Errorf("key %q, x-members %q", rec.Key, headers(rec)["x-members"])
	}
}
