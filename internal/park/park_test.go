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

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/outbox"
)

func first(table, dest, key string) First {
	return First{Table: table, Dest: dest, Key: key, Reason: "too large", ID: "id-" + key, LSN: 0x16B3748,
		Since: time.Date(2026, 11, 26, 0, 0, 0, 0, time.UTC), Topic: "parked"}
}

// TestSet: a key parks once, whatever the table or topic of its events
// (one parking a key: two would send its events back out of order); the
// set is bounded; its records are numbered by the run that produced them;
// and its list is a copy in a stable order that a new set starts from,
// whose session numbers its records in a run of its own.
func TestSet(t *testing.T) {
	s := New(nil, 2, 0)
	if s.Parked([]byte("a")) != nil || (*Set)(nil).Parked([]byte("a")) != nil {
		t.Fatal("an empty set parks nothing")
	}
	p, err := s.Park(first("public.outbox", "orders", "a"))
	if err != nil || s.Parked([]byte("a")) != p {
		t.Fatalf("park a: %v", err)
	}
	for _, again := range []First{first("public.outbox", "payments", "a"), first("public.other", TableDest("public.other"), "a")} {
		if _, err := s.Park(again); err == nil {
			t.Fatalf("a parked key parked again, for %s of %s: two parkings of one key", again.Dest, again.Table)
		}
	}
	if _, err := s.Park(first("public.outbox", TableDest("public.outbox"), "b")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Park(first("public.outbox", "orders", "c")); !errors.Is(err, ErrFull) {
		t.Fatalf("a third key past 2: %v, want ErrFull", err)
	}
	run, n, err := s.Number(p)
	if err != nil || n != 1 || p.RunOf(1) != run {
		t.Fatalf("the first record: run %q number %d (%v); runs %+v", run, n, err, p.Runs)
	}
	s.Count(p, n, false)
	list := s.List()
	if len(list) != 2 || list[0].Key != "a" || list[1].Key != "b" || list[0].Events != 1 {
		t.Fatalf("list %+v", list)
	}
	list[0].Events, list[0].Runs[0].From = 99, 99
	if p.Events == 99 || p.Runs[0].From == 99 {
		t.Fatal("the list is not a copy")
	}
	next := New(s.List(), 2, 0)
	if got := next.List(); !reflect.DeepEqual(got, s.List()) {
		t.Fatalf("a set from the list: %+v", got)
	}
	q := next.ByKey("a")
	run2, n2, err := next.Number(q)
	if err != nil || n2 != 2 || run2 == run || q.RunOf(1) != run || q.RunOf(2) != run2 || q.RunOf(7) != run2 {
		t.Fatalf("the next session's record: run %q number %d (%v), runs %+v", run2, n2, err, q.Runs)
	}
	s.Unpark(p)
	if s.Len() != 1 || s.Parked([]byte("a")) != nil {
		t.Fatal("unparked a is still parked")
	}
	if _, err := s.Park(first("public.outbox", "orders", "a")); err != nil {
		t.Fatalf("a key redriven parks again: %v", err)
	}
}

// TestSetFitsTheCheckpoint: the parked keys are part of every checkpoint
// record, which must fit the checkpoint topic: a park whose entry would
// take the set past its share is refused (ErrFullBytes), and a long
// reason is kept cut, so the share holds about as many keys as it says;
// so is a run that would not fit.
func TestSetFitsTheCheckpoint(t *testing.T) {
	s := New(nil, 1000, 2048)
	long := strings.Repeat("é", 10_000)
	var err error
	n := 0
	for ; err == nil; n++ {
		var p *checkpoint.Parked
		f := first("public.outbox", "orders", fmt.Sprintf("key-%d", n))
		f.Reason = long
		p, err = s.Park(f)
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
		if _, err := escaped.Park(first("public.outbox", "orders", strings.Repeat("<&", 100)+fmt.Sprint(i))); err != nil {
			break
		}
	}
	// Sessions that each add a run to a parking.
	runs := New(nil, 1000, 1024)
	p, _ := runs.Park(first("public.outbox", "orders", "k"))
	for i := 0; ; i++ {
		again := New(runs.List(), 1000, 1024)
		q := again.ByKey("k")
		if _, n, err := again.Number(q); err != nil {
			if !errors.Is(err, ErrFullBytes) || i < 3 {
				t.Fatalf("run %d: %v; want ErrFullBytes after a few", i, err)
			}
			break
		} else {
			again.Count(q, n, false)
		}
		runs, p = again, q
	}
	_ = p
	for _, set := range []struct {
		s     *Set
		share int
	}{{s, 2048}, {escaped, 8192}, {runs, 1024}} {
		b, jerr := json.Marshal(checkpoint.Record{Parked: set.s.List()})
		empty, _ := json.Marshal(checkpoint.Record{})
		if jerr != nil || len(b)-len(empty) > set.share {
			t.Fatalf("%d parked keys take %d bytes of the record (%v), more than their %d-byte share", set.s.Len(), len(b)-len(empty), jerr, set.share)
		}
	}
	s.Unpark(s.ByKey("key-0"))
	f := first("public.outbox", "orders", "again")
	f.Reason = long
	if _, err := s.Park(f); err != nil {
		t.Fatalf("a key parked once another was redriven: %v", err)
	}
}

// TestSeal: a parked record's seal verifies with its pipeline's keys only,
// and any change of what a redrive reads breaks it.
func TestSeal(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	rec := func() *kgo.Record {
		r := &kgo.Record{Topic: "parked", Key: []byte("k"), Value: []byte(`{"a":1}`),
			Headers: []kgo.RecordHeader{{Key: "id", Value: []byte("e-1")}, {Key: HeaderSeq, Value: Seq("run", 3)}}}
		Seal(r, key, "slot/1")
		return r
	}
	if !Sealed(rec(), [][]byte{[]byte("other-key-0123456789abcdef012345"), key}, "slot/1") {
		t.Fatal("a sealed record does not verify")
	}
	if Sealed(rec(), [][]byte{key}, "slot/2") {
		t.Fatal("a record verifies for another pipeline")
	}
	for name, edit := range map[string]func(*kgo.Record){
		"topic":         func(r *kgo.Record) { r.Topic = "other" },
		"key":           func(r *kgo.Record) { r.Key = []byte("j") },
		"value":         func(r *kgo.Record) { r.Value = []byte(`{"a":2}`) },
		"a header":      func(r *kgo.Record) { r.Headers[1].Value = Seq("run", 4) },
		"a header more": func(r *kgo.Record) { r.Headers = append(r.Headers[:2:2], kgo.RecordHeader{Key: "x"}, r.Headers[2]) },
		"no seal":       func(r *kgo.Record) { r.Headers = r.Headers[:2] },
		"moved headers": func(r *kgo.Record) { r.Headers[0].Key, r.Headers[0].Value = "i", []byte("de-1") },
	} {
		r := rec()
		edit(r)
		if Sealed(r, [][]byte{key}, "slot/1") {
			t.Errorf("%s changed: the seal still verifies", name)
		}
	}
	if run, n, ok := ParseSeq(string(Seq("ab12", 42))); !ok || run != "ab12" || n != 42 {
		t.Fatalf("ParseSeq = %q %d %v", run, n, ok)
	}
	for _, bad := range []string{"", "ab", "ab/", "ab/0", "ab/-1", "ab/x"} {
		if _, _, ok := ParseSeq(bad); ok {
			t.Errorf("ParseSeq(%q) ok", bad)
		}
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
	back, _, err := DecodeEvent(EncodeEvent(&ev, false), src)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, ev) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", back, ev)
	}
	if _, _, err := DecodeEvent(EncodeEvent(&ev, false), &outbox.Source{}); err == nil {
		t.Fatal("an event of another shape decoded")
	}
}

// TestRequestSignature: a redrive request verifies with its key and its
// pipeline's only, and any field changed breaks it: the parkings it names
// above all, which are what the operator saw.
func TestRequestSignature(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	r := Request{ID: RequestPrefix + "1", Parkings: []Ref{{Key: "a", Episode: "e1"}, {Key: "b", Episode: "e2"}}, RequestedAt: time.Now()}
	r.Sign(key, "slot/1")
	if !r.Verify([][]byte{[]byte("other-key-0123456789abcdef012345"), key}, "slot/1") || r.Verify([][]byte{key}, "slot/2") {
		t.Fatal("verifies with its key and pipeline only")
	}
	for _, edit := range []func(*Request){
		func(r *Request) { r.Parkings = []Ref{{Key: "a", Episode: "e1"}} },
		func(r *Request) { r.Parkings = []Ref{{Key: "a", Episode: "e9"}, {Key: "b", Episode: "e2"}} },
		func(r *Request) { r.Parkings = []Ref{{Key: "ae", Episode: "1"}, {Key: "b", Episode: "e2"}} },
		func(r *Request) { r.DropFirst = true },
		func(r *Request) { r.AcceptGap = true },
		func(r *Request) { r.ID += "2" },
		func(r *Request) { r.RequestedAt = r.RequestedAt.Add(time.Hour) },
	} {
		c := r
		c.Parkings = append([]Ref(nil), r.Parkings...)
		edit(&c)
		if c.Verify([][]byte{key}, "slot/1") {
			t.Fatalf("an edited request verifies: %+v", c)
		}
	}
	b, _ := json.Marshal(r)
	if back, err := ParseRequest(r.ID, b); err != nil || !back.Verify([][]byte{key}, "slot/1") {
		t.Fatalf("parsed back: %v", err)
	}
	if _, err := ParseRequest("redrive-other", b); err == nil {
		t.Fatal("a request read under another id parses")
	}
	many := Request{ID: "redrive-x", Parkings: make([]Ref, MaxRefs+1)}
	if b, _ := json.Marshal(many); true {
		if _, err := ParseRequest("redrive-x", b); err == nil {
			t.Fatal("a request of more than MaxRefs parkings parses")
		}
	}
}

// BenchmarkParkedLookup is what every event pays for parking: with
// nothing parked, one comparison; with 100 keys parked, one map lookup
// for a key that is not.
func BenchmarkParkedLookup(b *testing.B) {
	for _, n := range []int{0, 100} {
		b.Run(fmt.Sprintf("parked=%d", n), func(b *testing.B) {
			s := New(nil, 1000, 0)
			for i := 0; i < n; i++ {
				s.Park(first("public.outbox", "outbox.event.order", fmt.Sprintf("agg-%d", i)))
			}
			key := []byte("agg-417-free")
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				if s.Parked(key) != nil {
					b.Fatal("parked")
				}
			}
		})
	}
}

// TestKeyID: a parking is known by its key as it is up to MaxKey bytes,
// and by the key's digest past that, for a key that is not UTF-8 (the
// checkpoint's JSON would change it) or one that begins as a digest does;
// a set finds the parking by the key as the rows have it, one saved before
// KeyID included; a selector takes a parking by the key either way, and
// never two by one --key. Drawn keys of every length around the bound.
func TestKeyID(t *testing.T) {
	long := strings.Repeat("k", MaxKey+1)
	forged := KeyID(long) // a short key that reads as long's digest
	if KeyID(forged) == forged || KeyID(forged) == KeyID(long) {
		t.Fatalf("KeyID(%q) = %q: a key passes for a digest", forged, KeyID(forged))
	}
	for n := 1; n <= 2*MaxKey; n += 7 {
		for _, k := range []string{strings.Repeat("x", n), "\xff" + strings.Repeat("x", n)} {
			id := KeyID(k)
			plainKey := n <= MaxKey && utf8.ValidString(k)
			switch {
			case plainKey && id != k:
				t.Fatalf("KeyID of a %d-byte key = %q, want the key", len(k), id)
			case !plainKey && (!isDigest(id) || len(id) > MaxKey):
				t.Fatalf("KeyID of a %d-byte key %.8q = %q, want a digest", len(k), k, id)
			}
			s := New(nil, 10, 0)
			p, err := s.Park(first("public.outbox", "orders", k))
			if err != nil {
				t.Fatal(err)
			}
			if s.Parked([]byte(k)) != p || s.ByKey(id) != p || s.ByKey(k) != p || p.Key != id {
				t.Fatalf("a %d-byte key's parking is not found by it", len(k))
			}
			// Through the checkpoint (JSON) and a new set.
			b, err := json.Marshal(checkpoint.Record{Parked: s.List()})
			if err != nil {
				t.Fatal(err)
			}
			var back checkpoint.Record
			if err := json.Unmarshal(b, &back); err != nil {
				t.Fatal(err)
			}
			if q := New(back.Parked, 10, 0).Parked([]byte(k)); q == nil || q.Key != id {
				t.Fatalf("a %d-byte key %.8q is not found parked after the checkpoint's round trip: %+v", len(k), k, back.Parked)
			}
			list := []checkpoint.Parked{*p}
			if len((Selector{Key: k}).Pick(list)) != 1 || len((Selector{Key: id}).Pick(list)) != 1 || len((Selector{Key: k + "y"}).Pick(list)) != 0 {
				t.Fatalf("a selector of a %d-byte key does not take its parking, or takes another's", len(k))
			}
		}
	}
	// A checkpoint written before parkings were known by KeyID names the
	// long key as it is, and a key that reads as a digest as it is.
	s := New([]checkpoint.Parked{{Key: long, Topic: "parked", Events: 1}, {Key: KeyID("other"), Topic: "parked", Events: 1}}, 10, 0)
	if p := s.Parked([]byte(long)); p == nil || p.Key != KeyID(long) {
		t.Fatalf("a saved long key's parking is not found by the key: %+v", p)
	}
	// A replay's hold is a map of the checkpoint's list as it was saved.
	if _, ok := Find(map[string]bool{long: true}, []byte(long)); !ok {
		t.Fatal("a saved long key, named as it is, is not found by the key")
	}
	if s.ByKey(long) == nil {
		t.Fatal("a request naming a saved long key as it is finds no parking")
	}
	if p := s.Parked([]byte(KeyID("other"))); p == nil {
		t.Fatal("a saved key that reads as a digest is not found by itself")
	}
	// One --key never selects two parkings: long's digest, as cdc parked
	// shows it, and a key that is that digest as it is (shown by its own).
	s = New(nil, 10, 0)
	for _, k := range []string{long, forged} {
		if _, err := s.Park(first("public.outbox", "orders", k)); err != nil {
			t.Fatal(err)
		}
	}
	if got := (Selector{Key: forged}).Pick(s.List()); len(got) != 1 || got[0].Key != KeyID(long) {
		t.Fatalf("--key %q selects %+v; want long's parking only", forged, got)
	}
}
