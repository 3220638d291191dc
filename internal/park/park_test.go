package park

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/outbox"
)

// TestSet: a key parks once per destination, an event whose topic is
// unknown parks within its table, the set is bounded, and its list is a
// copy in a stable order that a new set starts from.
func TestSet(t *testing.T) {
	at := time.Date(2026, 11, 26, 0, 0, 0, 0, time.UTC)
	s := New(nil, 2, 0)
	if s.Parked("orders", "public.outbox", "a") != nil || (*Set)(nil).Parked("orders", "public.outbox", "a") != nil {
		t.Fatal("an empty set parks nothing")
	}
	p, err := s.Park("public.outbox", "orders", "a", "too large", "id-1", "e1", "parked", at)
	if err != nil || s.Parked("orders", "public.outbox", "a") != p || s.Parked("payments", "public.outbox", "a") != nil {
		t.Fatalf("park a: %v; a parked for orders only", err)
	}
	if _, err := s.Park("public.outbox", TableDest("public.outbox"), "b", "bad topic", "id-2", "e2", "parked", at); err != nil {
		t.Fatal(err)
	}
	if s.Parked("anything", "public.outbox", "b") == nil || s.Parked("anything", "public.other", "b") != nil {
		t.Fatal("a key parked within its table holds that table's events, whatever their topic")
	}
	if _, err := s.Park("public.outbox", "orders", "c", "r", "id-3", "e3", "parked", at); !errors.Is(err, ErrFull) {
		t.Fatalf("a third key past 2: %v, want ErrFull", err)
	}
	if again, err := s.Park("public.outbox", "orders", "a", "r", "id-9", "e9", "parked", at); err != nil || again != p {
		t.Fatalf("a parked key parked again: %v", err)
	}
	list := s.List()
	if len(list) != 2 || list[0].Key != "a" || list[1].Key != "b" {
		t.Fatalf("list %+v", list)
	}
	list[0].Events = 99
	if p.Events == 99 {
		t.Fatal("the list is not a copy")
	}
	if got := New(s.List(), 2, 0).List(); !reflect.DeepEqual(got, s.List()) {
		t.Fatalf("a set from the list: %+v", got)
	}
	if sel := s.Select(Selector{Table: "public.outbox"}); len(sel) != 2 {
		t.Fatalf("select a table: %d keys", len(sel))
	}
	s.Unpark(p)
	if s.Len() != 1 || s.Parked("orders", "public.outbox", "a") != nil {
		t.Fatal("unparked a is still parked")
	}
}

// TestSetFitsTheCheckpoint: the parked keys are part of every checkpoint
// record, which must fit the checkpoint topic: a park whose entry would
// take the set past its share is refused (ErrFullBytes), and a long
// reason is kept cut, so the share holds about as many keys as it says.
func TestSetFitsTheCheckpoint(t *testing.T) {
	at := time.Date(2026, 11, 26, 0, 0, 0, 0, time.UTC)
	s := New(nil, 1000, 2048)
	long := strings.Repeat("é", 10_000)
	var err error
	n := 0
	for ; err == nil; n++ {
		var p *checkpoint.Parked
		p, err = s.Park("public.outbox", "orders", fmt.Sprintf("key-%d", n), long, "id", "episode", "parked", at)
		if err == nil && (len(p.Reason) > MaxReason || !utf8.ValidString(p.Reason)) {
			t.Fatalf("reason kept as %d bytes (valid UTF-8 %v), want at most %d", len(p.Reason), utf8.ValidString(p.Reason), MaxReason)
		}
	}
	if !errors.Is(err, ErrFullBytes) || n-1 < 3 {
		t.Fatalf("parked %d keys of a 2048-byte share, then %v; want at least 3, then ErrFullBytes", n-1, err)
	}
	// Keys the application chose: JSON writes '<' and '&' as six bytes.
	escaped := New(nil, 1000, 8192)
	for i := 0; ; i++ {
		if _, err := escaped.Park("public.outbox", "orders", strings.Repeat("<&", 100)+fmt.Sprint(i), "r", "id", "e", "parked", at); err != nil {
			break
		}
	}
	for _, set := range []struct {
		s     *Set
		share int
	}{{s, 2048}, {escaped, 8192}} {
		b, jerr := json.Marshal(checkpoint.Record{Parked: set.s.List()})
		empty, _ := json.Marshal(checkpoint.Record{})
		if jerr != nil || len(b)-len(empty) > set.share {
			t.Fatalf("%d parked keys take %d bytes of the record (%v), more than their %d-byte share", set.s.Len(), len(b)-len(empty), jerr, set.share)
		}
	}
	s.Unpark(s.Select(Selector{All: true})[0])
	if _, err := s.Park("public.outbox", "orders", "again", long, "id", "episode", "parked", at); err != nil {
		t.Fatalf("a key parked once another was redriven: %v", err)
	}
}

// TestEventRoundTrip: a parked first event comes back as it was (but its
// payload, which is the record's value), NULLs and empty values apart.
func TestEventRoundTrip(t *testing.T) {
	src := &outbox.Source{Extra: []string{"tenant", "note"}}
	ev := outbox.Event{Source: src, CommitLSN: 0x16B3748, CommitTime: time.Date(2026, 11, 26, 1, 2, 3, 4, time.UTC), XID: 77,
		Extra: []outbox.Value{{B: []byte("acme"), Kind: outbox.KindText}, {}}}
	ev.Fields[outbox.FieldID] = outbox.Value{B: []byte("id-1"), Kind: outbox.KindText}
	ev.Fields[outbox.FieldAggregateID] = outbox.Value{B: []byte{}, Kind: outbox.KindText}
	back, err := DecodeEvent(EncodeEvent(&ev), src)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, ev) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", back, ev)
	}
	if _, err := DecodeEvent(EncodeEvent(&ev), &outbox.Source{}); err == nil {
		t.Fatal("an event of another shape decoded")
	}
}

// TestRequestSignature: a redrive request verifies with its key and its
// pipeline's only, and any field changed breaks it.
func TestRequestSignature(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	r := Request{ID: RequestPrefix + "1", Key: "a", RequestedAt: time.Now()}
	r.Sign(key, "slot/1")
	if !r.Verify([][]byte{[]byte("other-key-0123456789abcdef012345"), key}, "slot/1") || r.Verify([][]byte{key}, "slot/2") {
		t.Fatal("verifies with its key and pipeline only")
	}
	for _, edit := range []func(*Request){func(r *Request) { r.Key = "b" }, func(r *Request) { r.All = true }, func(r *Request) { r.DropFirst = true }, func(r *Request) { r.RequestedAt = r.RequestedAt.Add(time.Hour) }} {
		c := r
		edit(&c)
		if c.Verify([][]byte{key}, "slot/1") {
			t.Fatalf("an edited request verifies: %+v", c)
		}
	}
}

// BenchmarkParkedLookup is what every event of a table pays for parking:
// with nothing parked, one comparison; with 100 keys parked, two map
// lookups for a key that is not.
func BenchmarkParkedLookup(b *testing.B) {
	for _, n := range []int{0, 100} {
		b.Run(fmt.Sprintf("parked=%d", n), func(b *testing.B) {
			s := New(nil, 1000, 0)
			for i := 0; i < n; i++ {
				s.Park("public.outbox", "outbox.event.order", fmt.Sprintf("agg-%d", i), "r", "id", "e", "parked", time.Time{})
			}
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				if s.Parked("outbox.event.order", "public.outbox", "agg-417-free") != nil {
					b.Fatal("parked")
				}
			}
		})
	}
}
