package route

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/outbox"
)

var commitTime = time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)

func table(mod func(*outbox.Source)) *outbox.Source {
	t := &outbox.Source{Name: outbox.TableName{Schema: "public", Name: "outbox"}, Columns: outbox.DefaultColumns}
	if mod != nil {
		mod(t)
	}
	if err := t.Validate(); err != nil {
		panic(err)
	}
	return t
}

func text(s string) outbox.Value { return outbox.Value{B: []byte(s), Kind: outbox.KindText} }

func event(t *outbox.Source) *outbox.Event {
	ev := &outbox.Event{Source: t, CommitLSN: 0x16B3748, CommitTime: commitTime, Extra: make([]outbox.Value, len(t.Extra))}
	ev.Fields[outbox.FieldID] = text("e-1")
	ev.Fields[outbox.FieldAggregateType] = text("order")
	ev.Fields[outbox.FieldAggregateID] = text("o-7")
	ev.Fields[outbox.FieldEventType] = text("OrderPaid")
	ev.Fields[outbox.FieldPayload] = outbox.Value{B: []byte(`{"total": 12, "nested": {"a": [1, "ü✓"]}}`), Kind: outbox.KindJSON}
	return ev
}

func record(t *testing.T, tbl *outbox.Source, ev *outbox.Event) *kgo.Record {
	t.Helper()
	r, err := New([]*outbox.Source{tbl})
	if err != nil {
		t.Fatal(err)
	}
	if ev == nil {
		ev = event(tbl)
	}
	rec, err := r.Record(ev)
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

func headers(rec *kgo.Record) map[string]string {
	m := map[string]string{}
	for _, h := range rec.Headers {
		m[h.Key] = string(h.Value)
	}
	return m
}

func wantHeaders(t *testing.T, rec *kgo.Record, want map[string]string) {
	t.Helper()
	got := headers(rec)
	if len(got) != len(want) || len(rec.Headers) != len(want) {
		t.Errorf("headers = %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("header %s = %q, want %q", k, got[k], v)
		}
	}
}

func TestPayloadFormat(t *testing.T) {
	rec := record(t, table(nil), nil)
	if rec.Topic != "outbox.event.order" || string(rec.Key) != "o-7" || string(rec.Value) != `{"total": 12, "nested": {"a": [1, "ü✓"]}}` || !rec.Timestamp.Equal(commitTime) {
		t.Fatalf("record = %+v", rec)
	}
	wantHeaders(t, rec, map[string]string{"id": "e-1", "event_type": "OrderPaid", "aggregate_type": "order", "commit_lsn": "0/16B3748"})

	tbl := table(nil)
	ev := event(tbl)
	ev.Fields[outbox.FieldPayload] = outbox.Value{Kind: outbox.KindJSON}
	if rec := record(t, tbl, ev); rec.Value == nil || len(rec.Value) != 0 {
		t.Fatalf("NULL payload: value %v (nil=%v); want an empty, non-null value", rec.Value, rec.Value == nil)
	}
}

func TestTombstone(t *testing.T) {
	tbl := table(func(t *outbox.Source) { t.Tombstone = true; t.Format = outbox.FormatEnvelope })
	for _, payload := range []outbox.Value{{Kind: outbox.KindJSON}, {B: []byte{}, Kind: outbox.KindText}} {
		ev := event(tbl)
		ev.Fields[outbox.FieldPayload] = payload
		if rec := record(t, tbl, ev); rec.Value != nil || string(rec.Key) != "o-7" {
			t.Fatalf("payload %q: value %q, key %q; want a tombstone (null value) for the key", payload.B, rec.Value, rec.Key)
		}
	}
	if rec := record(t, tbl, nil); rec.Value == nil {
		t.Fatal("a non-empty payload became a tombstone")
	}
}

// TestSeed004Envelope produces seed 004's envelope and x- headers exactly.
func TestSeed004Envelope(t *testing.T) {
	tbl := table(func(t *outbox.Source) {
		t.Name = outbox.TableName{Schema: "public", Name: "event_outbox"}
		t.Columns = outbox.Columns{outbox.FieldID: "id", outbox.FieldAggregateType: "aggregate_type", outbox.FieldAggregateID: "aggregate_id",
			outbox.FieldEventType: "event_type", outbox.FieldPayload: "payload", outbox.FieldTimestamp: "created_at"}
		t.Topic, t.Key, t.Format = "holdco.events", "{aggregate_id}", outbox.FormatEnvelope
		t.Headers = map[string]string{"id": "x-event-id", "aggregate_type": "x-aggregate-type", "aggregate_id": "x-aggregate-id", "event_type": "x-event-type", "commit_lsn": ""}
		t.Additional = []outbox.Additional{
			{Column: "group_id", Placement: outbox.PlaceHeader, As: "x-group-id"},
			{Column: "subsidiary_id", Placement: outbox.PlaceHeader, As: "x-subsidiary-id"},
			{Column: "group_id", Placement: outbox.PlaceEnvelope},
			{Column: "subsidiary_id", Placement: outbox.PlaceEnvelope},
		}
	})
	ev := event(tbl)
	ev.Fields[outbox.FieldID] = text("9b2c")
	ev.Fields[outbox.FieldEventType] = text("created")
	ev.Fields[outbox.FieldTimestamp] = outbox.Value{B: []byte("2025-12-21 22:30:00+00"), Kind: outbox.KindTimestamp}
	ev.Extra[0] = text("g-1")
	ev.Extra[1] = outbox.Value{Kind: outbox.KindText} // NULL subsidiary
	rec := record(t, tbl, ev)
	want := `{"event_id":"9b2c","occurred_at":"2025-12-21T22:30:00Z","aggregate_type":"order","aggregate_id":"o-7","event_type":"created","group_id":"g-1","subsidiary_id":null,"payload":{"total": 12, "nested": {"a": [1, "ü✓"]}}}`
	if string(rec.Value) != want {
		t.Fatalf("envelope =\n%s\nwant\n%s", rec.Value, want)
	}
	wantHeaders(t, rec, map[string]string{"x-event-id": "9b2c", "x-aggregate-type": "order", "x-aggregate-id": "o-7", "x-event-type": "created", "x-group-id": "g-1"})
}

func TestEnvelopeTypes(t *testing.T) {
	tbl := table(func(t *outbox.Source) {
		t.Format = outbox.FormatEnvelope
		t.Columns[outbox.FieldVersion] = "v"
		t.Additional = []outbox.Additional{{Column: "n", Placement: outbox.PlaceEnvelope}, {Column: "b", Placement: outbox.PlaceEnvelope},
			{Column: "raw", Placement: outbox.PlaceEnvelope}, {Column: "nan", Placement: outbox.PlaceEnvelope}}
	})
	ev := event(tbl)
	ev.Fields[outbox.FieldID] = outbox.Value{B: []byte("17"), Kind: outbox.KindNumber} // SERIAL id stays a number
	ev.Fields[outbox.FieldVersion] = outbox.Value{B: []byte("2"), Kind: outbox.KindNumber}
	ev.Fields[outbox.FieldPayload] = text(`plain "text"`) // a text payload is a JSON string, escaped
	ev.Extra = []outbox.Value{{B: []byte("1.50"), Kind: outbox.KindNumber}, {B: []byte("f"), Kind: outbox.KindBool},
		{B: []byte{0, 1}, Kind: outbox.KindBytes}, {B: []byte("NaN"), Kind: outbox.KindNumber}}
	rec := record(t, tbl, ev)
	var got map[string]any
	if err := json.Unmarshal(rec.Value, &got); err != nil {
		t.Fatalf("envelope is not JSON: %v\n%s", err, rec.Value)
	}
	want := map[string]any{"event_id": 17.0, "version": 2.0, "n": 1.5, "b": false, "raw": "AAE=", "nan": "NaN", "payload": `plain "text"`,
		"occurred_at": "2026-11-22T10:00:00Z"}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %#v, want %#v", k, got[k], v)
		}
	}
}

func TestCloudEvents(t *testing.T) {
	mod := func(format string) func(*outbox.Source) {
		return func(t *outbox.Source) {
			t.Format = format
			t.CloudEventsSource = "/shop/{aggregate_type}"
			t.Columns[outbox.FieldTraceparent] = "traceparent"
		}
	}
	tp := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

	bin := table(mod(outbox.FormatCloudEventsBinary))
	ev := event(bin)
	ev.Fields[outbox.FieldTraceparent] = text(tp)
	rec := record(t, bin, ev)
	if string(rec.Value) != `{"total": 12, "nested": {"a": [1, "ü✓"]}}` {
		t.Fatalf("binary mode value = %s; want the payload", rec.Value)
	}
	wantHeaders(t, rec, map[string]string{"ce_specversion": "1.0", "ce_id": "e-1", "ce_source": "/shop/order", "ce_type": "OrderPaid",
		"ce_time": "2026-11-22T10:00:00Z", "ce_subject": "o-7", "content-type": "application/json", "traceparent": tp,
		"id": "e-1", "event_type": "OrderPaid", "aggregate_type": "order", "commit_lsn": "0/16B3748"})

	st := table(mod(outbox.FormatCloudEventsStructured))
	ev = event(st)
	rec = record(t, st, ev)
	want := `{"specversion":"1.0","id":"e-1","source":"/shop/order","type":"OrderPaid","subject":"o-7","time":"2026-11-22T10:00:00Z","datacontenttype":"application/json","data":{"total": 12, "nested": {"a": [1, "ü✓"]}}}`
	if string(rec.Value) != want || headers(rec)["content-type"] != "application/cloudevents+json; charset=UTF-8" {
		t.Fatalf("structured =\n%s\nwant\n%s\nheaders %v", rec.Value, want, headers(rec))
	}
	ev.Fields[outbox.FieldPayload] = outbox.Value{B: []byte{0xff}, Kind: outbox.KindBytes}
	if rec = record(t, st, ev); !strings.Contains(string(rec.Value), `"datacontenttype":"application/octet-stream","data_base64":"/w=="`) {
		t.Fatalf("bytes payload in structured mode: %s", rec.Value)
	}
}

func TestTemplates(t *testing.T) {
	tests := []struct {
		tmpl, want, wantErr string
	}{
		{tmpl: "outbox.event.{aggregate_type}", want: "outbox.event.order"},
		{tmpl: "{aggregate_type}.{event_type}", want: "order.OrderPaid"},
		{tmpl: "{schema}-{table}", want: "public-outbox"},
		{tmpl: "commands", want: "commands"},
		{tmpl: "{column:tenantId}.events", want: "acme.events"},
		{tmpl: "x.{nope}", wantErr: "unknown placeholder"},
		{tmpl: "x.{tenant}", wantErr: "not mapped"},
		{tmpl: "x.{prefix}", wantErr: "unknown placeholder"},
		{tmpl: "x.{aggregate_type", wantErr: "unclosed"},
	}
	for _, tt := range tests {
		t.Run(tt.tmpl, func(t *testing.T) {
			tbl := &outbox.Source{Name: outbox.TableName{Schema: "public", Name: "outbox"}, Columns: outbox.DefaultColumns, Topic: tt.tmpl}
			err := tbl.Validate()
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Validate err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			ev := event(tbl)
			if len(tbl.Extra) == 1 {
				ev.Extra = []outbox.Value{text("acme")}
			}
			got, err := expand(tbl.TopicTemplate, ev)
			if err != nil || got != tt.want {
				t.Fatalf("Expand = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

func TestTopicNormalisationIsOptIn(t *testing.T) {
	plain := table(nil)
	ev := event(plain)
	ev.Fields[outbox.FieldAggregateType] = text("Kitchen Task/v2")
	r, _ := New([]*outbox.Source{plain})
	if _, err := r.Record(ev); err == nil {
		t.Fatal("an illegal topic was accepted without normalisation turned on")
	}
	norm := table(func(t *outbox.Source) { t.TopicLowercase = true; t.TopicReplaceIllegal = "_" })
	ev = event(norm)
	ev.Fields[outbox.FieldAggregateType] = text("Kitchen Task/v2")
	if rec := record(t, norm, ev); rec.Topic != "outbox.event.kitchen_task_v2" {
		t.Fatalf("topic = %q", rec.Topic)
	}
}

func TestKeyFromColumn(t *testing.T) {
	// Seed 003's command_outbox has no aggregate columns.
	tbl := table(func(t *outbox.Source) {
		t.Name.Name = "command_outbox"
		t.Columns = outbox.Columns{outbox.FieldID: "id", outbox.FieldEventType: "command_type", outbox.FieldPayload: "payload"}
		t.Topic, t.Key = "commands", "{column:correlation_key}"
	})
	ev := event(tbl)
	ev.Extra = []outbox.Value{text("c-9")}
	rec := record(t, tbl, ev)
	if rec.Topic != "commands" || string(rec.Key) != "c-9" {
		t.Fatalf("record = %s key %s", rec.Topic, rec.Key)
	}
	wantHeaders(t, rec, map[string]string{"id": "e-1", "event_type": "OrderPaid", "commit_lsn": "0/16B3748"})
}

func TestPoisonEvents(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*outbox.Event)
		want   string
	}{
		{"illegal topic character", func(e *outbox.Event) { e.Fields[outbox.FieldAggregateType] = text("order/v2") }, `contains '/'`},
		{"topic too long", func(e *outbox.Event) { e.Fields[outbox.FieldAggregateType] = text(strings.Repeat("a", 250)) }, "249"},
		{"NULL aggregate type", func(e *outbox.Event) { e.Fields[outbox.FieldAggregateType] = outbox.Value{} }, "{aggregate_type} is NULL"},
		{"NULL key", func(e *outbox.Event) { e.Fields[outbox.FieldAggregateID] = outbox.Value{} }, "record key"},
		{"NULL id", func(e *outbox.Event) { e.Fields[outbox.FieldID] = outbox.Value{} }, "event id is NULL"},
	}
	tbl := table(nil)
	r, _ := New([]*outbox.Source{tbl})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ev := event(tbl)
			tt.mutate(ev)
			_, err := r.Record(ev)
			var ee *outbox.EventError
			if !errors.As(err, &ee) || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "0/16B3748") {
				t.Fatalf("err = %v; want an *outbox.EventError mentioning %q and the LSN", err, tt.want)
			}
		})
	}
}

func TestDeadLetter(t *testing.T) {
	tbl := table(func(t *outbox.Source) { t.OnInvalid = outbox.OnInvalidDeadLetter; t.DeadLetterTopic = "dlq" })
	r, _ := New([]*outbox.Source{tbl})
	// An illegal topic: the original headers are kept, and the topic that
	// cannot be formed is left out.
	ev := event(tbl)
	ev.Fields[outbox.FieldAggregateType] = text("bad/type")
	dl := r.DeadLetter(ev, "illegal topic")
	if dl.Topic != "dlq" || string(dl.Key) != "o-7" || string(dl.Value) != string(ev.Fields[outbox.FieldPayload].B) {
		t.Fatalf("dead letter = %+v", dl)
	}
	wantHeaders(t, dl, map[string]string{"id": "e-1", "event_type": "OrderPaid", "aggregate_type": "bad/type", "commit_lsn": "0/16B3748",
		"dead_letter_error": "illegal topic", "dead_letter_source": "public.outbox",
		"dead_letter_commit_lsn": "0/16B3748", "dead_letter_event_id": "e-1"})

	// A record that could be built (too large, say): its topic is named.
	dl = r.DeadLetter(event(tbl), "too large")
	if got := headers(dl)["dead_letter_topic"]; got != "outbox.event.order" || headers(dl)["id"] != "e-1" {
		t.Fatalf("dead letter headers = %v; want dead_letter_topic outbox.event.order and the original id", headers(dl))
	}

	// A NULL key: no key, the headers still there.
	ev = event(tbl)
	ev.Fields[outbox.FieldAggregateID] = outbox.Value{}
	if dl = r.DeadLetter(ev, "no key"); dl.Key != nil || headers(dl)["id"] != "e-1" {
		t.Fatalf("dead letter with a NULL key = key %q headers %v", dl.Key, headers(dl))
	}

	msg := &outbox.Source{MessagePrefix: "outbox", Columns: outbox.DefaultMessageFields, OnInvalid: outbox.OnInvalidDeadLetter}
	if err := msg.Validate(); err != nil {
		t.Fatal(err)
	}
	r, _ = New([]*outbox.Source{msg})
	mev := &outbox.Event{Source: msg, Raw: []byte("not json")}
	if dl := r.DeadLetter(mev, "bad"); string(dl.Value) != "not json" || headers(dl)["dead_letter_source"] != `message prefix "outbox"` {
		t.Fatalf("message dead letter = %+v", dl)
	}
}

// TestCommitLSNHeader: the cached text must match pglogrepl's format for
// every transaction, not only the first.
func TestCommitLSNHeader(t *testing.T) {
	tbl := table(nil)
	r, _ := New([]*outbox.Source{tbl})
	for _, lsn := range []pglogrepl.LSN{0x16B3748, 0x16B3748, 0x1_0000_00AB, 0, 0xFFFFFFFF_FFFFFFFF, 0x16B3748} {
		ev := event(tbl)
		ev.CommitLSN = lsn
		rec, err := r.Record(ev)
		if err != nil {
			t.Fatal(err)
		}
		if got := headers(rec)["commit_lsn"]; got != lsn.String() {
			t.Errorf("commit_lsn for %d = %q, want %q", uint64(lsn), got, lsn.String())
		}
	}
}

func TestParseTimestamp(t *testing.T) {
	for in, want := range map[string]string{
		"2026-11-22 10:00:00+00":        "2026-11-22T10:00:00Z",
		"2026-11-22 10:00:00.123456+00": "2026-11-22T10:00:00.123456Z",
		"2026-11-22 12:00:00+05:30":     "2026-11-22T06:30:00Z",
		"2026-11-22 10:00:00":           "2026-11-22T10:00:00Z",
		"2026-11-22T10:00:00Z":          "2026-11-22T10:00:00Z",
	} {
		got, ok := ParseTimestamp(in)
		if !ok || got.UTC().Format(time.RFC3339Nano) != want {
			t.Errorf("ParseTimestamp(%q) = %v, %v; want %s", in, got, ok, want)
		}
	}
}

// TestMaxTopics (issue 37): a templated topic yields at most max_topics
// distinct topics; an event whose row would make another is invalid, for
// on_invalid, and the topics already made stay open to later events.
func TestMaxTopics(t *testing.T) {
	tbl := table(func(t *outbox.Source) { t.Topic = "events.{aggregate_type}"; t.MaxTopics = 3 })
	r, err := New([]*outbox.Source{tbl})
	if err != nil {
		t.Fatal(err)
	}
	route := func(typ string) error {
		ev := event(tbl)
		ev.Fields[outbox.FieldAggregateType] = text(typ)
		_, err := r.Record(ev)
		return err
	}
	for i := 0; i < 10000; i++ {
		err := route("t" + strconv.Itoa(i))
		var ee *outbox.EventError
		if i < 3 && err != nil || i >= 3 && (!errors.As(err, &ee) || !strings.Contains(err.Error(), "tables[].max_topics (3)")) {
			t.Fatalf("type %d: %v", i, err)
		}
	}
	if err := route("t1"); err != nil {
		t.Fatalf("a topic made before the bound: %v", err)
	}
	if n := len(r.routes[tbl].distinct); n != 3 {
		t.Fatalf("%d distinct topics kept, want 3", n)
	}
}

// TestTopicCache: the topic cache returns each expansion's own topic, with
// the source's normalisation, also once it has filled and started over, and
// an illegal expansion is never cached as legal.
func TestTopicCache(t *testing.T) {
	tbl := table(func(t *outbox.Source) {
		t.Topic = "events.{aggregate_type}"
		t.TopicLowercase = true
		t.MaxTopics = 2 * (maxCachedTopics + 10)
	})
	r, err := New([]*outbox.Source{tbl})
	if err != nil {
		t.Fatal(err)
	}
	for round := 0; round < 2; round++ {
		for i := 0; i < maxCachedTopics+10; i++ {
			ev := event(tbl)
			typ := "Order" + strings.Repeat("X", i%3) + string(rune('A'+i%26)) + "-" + strings.Repeat("9", i%7) + "_" + strconv.Itoa(i)
			ev.Fields[outbox.FieldAggregateType] = text(typ)
			rec, err := r.Record(ev)
			if err != nil {
				t.Fatal(err)
			}
			if want := "events." + strings.ToLower(typ); rec.Topic != want {
				t.Fatalf("round %d, event %d: topic %q, want %q", round, i, rec.Topic, want)
			}
		}
	}
	for i := 0; i < 2; i++ {
		ev := event(tbl)
		ev.Fields[outbox.FieldAggregateType] = text("bad/type")
		var ee *outbox.EventError
		if _, err := r.Record(ev); !errors.As(err, &ee) {
			t.Fatalf("try %d: an illegal topic gave %v, want an EventError", i, err)
		}
	}
}

// TestStructuredJSONWithControlBytes (issue 37): an event type holding a
// control byte (and one with invalid UTF-8) still makes a JSON document
// with cloudevents-structured: the attribute is escaped as JSON, never in
// Go's syntax (\x01), so the event is delivered, not judged invalid.
func TestStructuredJSONWithControlBytes(t *testing.T) {
	tbl := table(func(t *outbox.Source) { t.Format = outbox.FormatCloudEventsStructured })
	r, err := New([]*outbox.Source{tbl})
	if err != nil {
		t.Fatal(err)
	}
	for _, typ := range []string{"Order\x01Created", "Order\xffCreated", `Order"Created\`} {
		ev := event(tbl)
		ev.Fields[outbox.FieldEventType] = text(typ)
		rec, err := r.Record(ev)
		if err != nil {
			t.Fatalf("event type %q: %v", typ, err)
		}
		var doc map[string]any
		if err := json.Unmarshal(rec.Value, &doc); err != nil {
			t.Fatalf("event type %q: the value is not JSON (%v): %s", typ, err, rec.Value)
		}
		if want := strings.ToValidUTF8(typ, "\uFFFD"); doc["type"] != want {
			t.Errorf("type %q, want %q", doc["type"], want)
		}
	}
}

// TestTruncateDeadLetter (issue 37): a dead letter larger than its limit
// keeps the reason, source and LSN headers, loses what it must of its
// value (then key and other headers), and says so.
func TestTruncateDeadLetter(t *testing.T) {
	size := func(r *kgo.Record) int {
		n := len(r.Key) + len(r.Value) + 128
		for _, h := range r.Headers {
			n += len(h.Key) + len(h.Value) + 8
		}
		return n
	}
	for _, tc := range []struct {
		name       string
		value, key int
		limit      int
	}{
		{"value cut", 100000, 10, 2000},
		{"key cut too", 10, 50000, 2000},
		{"fits", 10, 10, 2000},
	} {
		dl := &kgo.Record{Value: bytes.Repeat([]byte("v"), tc.value), Key: bytes.Repeat([]byte("k"), tc.key), Headers: []kgo.RecordHeader{
			{Key: HeaderDeadLetterError, Value: []byte("it was invalid because")},
			{Key: HeaderDeadLetterSource, Value: []byte("public.outbox")},
			{Key: HeaderDeadLetterLSN, Value: []byte("0/16B3748")},
			{Key: HeaderID, Value: bytes.Repeat([]byte("i"), 3000)},
		}}
		before := size(dl)
		TruncateDeadLetter(dl, tc.limit, size)
		if got := size(dl); got > tc.limit && before > tc.limit {
			t.Errorf("%s: %d bytes after, limit %d", tc.name, got, tc.limit)
		}
		note := ""
		for _, h := range dl.Headers {
			if h.Key == HeaderDeadLetterTruncated {
				note = string(h.Value)
			}
			if h.Key == HeaderDeadLetterError && string(h.Value) != "it was invalid because" {
				t.Errorf("%s: the reason was cut", tc.name)
			}
		}
		if (before > tc.limit) != (note != "") {
			t.Errorf("%s: note %q (record was %d bytes, limit %d)", tc.name, note, before, tc.limit)
		}
	}
}
