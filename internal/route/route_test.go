package route

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/outboxcdc/cdc/internal/outbox"
)

func event(tbl *outbox.Table) *outbox.Event {
	return &outbox.Event{
		Table: tbl, ID: []byte("e-1"), AggregateType: []byte("order"), AggregateID: []byte("o-7"),
		Type: []byte("OrderPaid"), Payload: []byte(`{"total": 12}`), CommitLSN: 0x16B3748, CommitTime: time.Unix(1700000000, 0),
	}
}

func TestRecord(t *testing.T) {
	tbl := &outbox.Table{Name: outbox.TableName{Schema: "public", Name: "outbox"}, Columns: outbox.DefaultColumns, Topic: outbox.DefaultTopic}
	r, err := New([]*outbox.Table{tbl})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := r.Record(event(tbl))
	if err != nil {
		t.Fatal(err)
	}
	if rec.Topic != "outbox.event.order" || string(rec.Key) != "o-7" || string(rec.Value) != `{"total": 12}` || !rec.Timestamp.Equal(time.Unix(1700000000, 0)) {
		t.Fatalf("record = %+v", rec)
	}
	want := map[string]string{"id": "e-1", "event_type": "OrderPaid", "aggregate_type": "order", "commit_lsn": "0/16B3748"}
	if len(rec.Headers) != len(want) {
		t.Fatalf("headers = %v", rec.Headers)
	}
	for _, h := range rec.Headers {
		if want[h.Key] != string(h.Value) {
			t.Errorf("header %s = %q, want %q", h.Key, h.Value, want[h.Key])
		}
	}

	ev := event(tbl)
	ev.Payload = nil
	rec, err = r.Record(ev)
	if err != nil || rec.Value == nil || len(rec.Value) != 0 {
		t.Fatalf("NULL payload: value %v (nil=%v), err %v; want an empty, non-null value", rec.Value, rec.Value == nil, err)
	}
}

func TestTemplates(t *testing.T) {
	tbl := &outbox.Table{Name: outbox.TableName{Schema: "tenant", Name: "OutboxEvent"}}
	tests := []struct {
		tmpl, want, wantErr string
	}{
		{tmpl: "outbox.event.{aggregate_type}", want: "outbox.event.order"},
		{tmpl: "{aggregate_type}.{event_type}", want: "order.OrderPaid"},
		{tmpl: "{schema}-{table}", want: "tenant-OutboxEvent"},
		{tmpl: "commands", want: "commands"},
		{tmpl: "x.{nope}", wantErr: "unknown placeholder"},
		{tmpl: "x.{aggregate_type", wantErr: "unclosed"},
		{tmpl: "", wantErr: "empty"},
	}
	for _, tt := range tests {
		t.Run(tt.tmpl, func(t *testing.T) {
			c, err := Compile(tt.tmpl)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Compile err = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got, err := c.Expand(event(tbl))
			if err != nil || got != tt.want {
				t.Fatalf("Expand = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

func TestPoisonEvents(t *testing.T) {
	tbl := &outbox.Table{Name: outbox.TableName{Schema: "public", Name: "outbox"}, Columns: outbox.DefaultColumns, Topic: outbox.DefaultTopic}
	r, _ := New([]*outbox.Table{tbl})
	tests := []struct {
		name   string
		mutate func(*outbox.Event)
		want   string
	}{
		{"illegal topic character", func(e *outbox.Event) { e.AggregateType = []byte("order/v2") }, `contains '/'`},
		{"topic too long", func(e *outbox.Event) { e.AggregateType = []byte(strings.Repeat("a", 250)) }, "249"},
		{"NULL aggregate type", func(e *outbox.Event) { e.AggregateType = nil }, "NULL"},
		{"NULL key", func(e *outbox.Event) { e.AggregateID = nil }, "record key"},
		{"NULL id", func(e *outbox.Event) { e.ID = nil }, "event id"},
	}
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
