package request_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/park"
	"github.com/outboxcdc/cdc/internal/request"
)

var (
	key      = []byte("0123456789abcdef0123456789abcdef")
	otherKey = []byte("fedcba9876543210fedcba9876543210")
	redrive  = request.Kind[park.Request]{Name: "redrive", Parse: park.ParseRequest}
)

// follower is the checkpoint topic's requests as a map: read, ids the
// follower holds; lookups counts the looks at the topic's end.
type follower struct {
	values  map[string][]byte
	read    map[string]bool
	lookups int
}

func (f *follower) Read(id string) bool { return f.read[id] }

func (f *follower) Get(_ context.Context, id string) ([]byte, bool, error) {
	if !f.read[id] {
		f.lookups++
	}
	v, ok := f.values[id]
	return v, ok, nil
}

func signed(id string, at time.Time, k []byte, pipeline string) park.Request {
	r := park.Request{ID: id, Parkings: []park.Ref{{Key: "k-" + id, Episode: "e-" + id}}, RequestedAt: at}
	r.Sign(k, pipeline)
	return r
}

func admission(id string, at time.Time, taken map[string]bool) request.Admission {
	return request.Admission{ID: id, At: at, Keys: [][]byte{key}, Key: "slot/1", Taken: func(id string) bool { return taken[id] },
		Blocking: func(fn func() error) error { return fn() }}
}

// TestAdmitRefuses: each way a request may be wrong is refused, a forged
// one said so, and nothing refused runs.
func TestAdmitRefuses(t *testing.T) {
	now := time.Now()
	put := func(f *follower, r park.Request) {
		b, _ := json.Marshal(r)
		f.values[r.ID], f.read[r.ID] = b, true
	}
	for _, tc := range []struct {
		name   string
		req    park.Request
		stored bool
		keys   [][]byte
		taken  bool
		forged bool
	}{
		{"not in the checkpoint topic", signed("redrive-1", now, key, "slot/1"), false, [][]byte{key}, false, false},
		{"no key to check with", signed("redrive-1", now, key, "slot/1"), true, nil, false, false},
		{"another key", signed("redrive-1", now, otherKey, "slot/1"), true, [][]byte{key}, false, true},
		{"another pipeline", signed("redrive-1", now, key, "slot/2"), true, [][]byte{key}, false, true},
		{"unsigned", park.Request{ID: "redrive-1", Parkings: []park.Ref{{Key: "k"}}, RequestedAt: now}, true, [][]byte{key}, false, true},
		{"announced again later (replayed)", signed("redrive-1", now.Add(-checkpoint.RequestMaxAge-time.Minute), key, "slot/1"), true, [][]byte{key}, false, true},
		{"made far ahead of its announcement", signed("redrive-1", now.Add(checkpoint.RequestMaxAge+time.Minute), key, "slot/1"), true, [][]byte{key}, false, true},
		{"taken already", signed("redrive-1", now, key, "slot/1"), true, [][]byte{key}, true, false},
		{"no parkings named", park.Request{ID: "redrive-1", RequestedAt: now}, true, [][]byte{key}, false, true},
	} {
		f := &follower{values: map[string][]byte{}, read: map[string]bool{}}
		if tc.stored {
			put(f, tc.req)
		}
		var g request.Gate
		a := admission("redrive-1", now, map[string]bool{"redrive-1": tc.taken})
		a.Keys = tc.keys
		_, err := request.Admit(context.Background(), &g, f, redrive, a)
		var refused *request.Refused
		if !errors.As(err, &refused) || refused.Forged != tc.forged {
			t.Errorf("%s: Admit = %v; want refused, forged %v", tc.name, err, tc.forged)
		}
	}
	// Signed with a key being rotated out: every key of the file verifies.
	f := &follower{values: map[string][]byte{}, read: map[string]bool{}}
	put(f, signed("redrive-2", now, key, "slot/1"))
	var g request.Gate
	a := admission("redrive-2", now, nil)
	a.Keys = [][]byte{otherKey, key}
	if req, err := request.Admit(context.Background(), &g, f, redrive, a); err != nil || req.ID != "redrive-2" {
		t.Fatalf("Admit = %+v, %v", req, err)
	}
}

// TestAnnouncementsInAnyOrder is a property test of the one way in: a
// generator announces requests in any order, count and form (the
// operator's, each once or replayed, forged ones, unsigned ones, old ones
// announced again, ids nobody wrote, floods of them, garbage), against a
// follower that has read some of them, with a clock that moves; the
// pipeline remembers what it took, as the checkpoint does. Whatever the
// sequence: only the operator's requests run, each at most once; nothing
// forged, replayed or unknown does; the looks at the topic's end stay
// within the budget (request.LookupsPerSecond, and one each for the
// ids the follower has not read that pass it); and the gate's memory stays
// bounded. CDC_REQUEST_SEED picks one sequence to replay.
func TestAnnouncementsInAnyOrder(t *testing.T) {
	seeds := []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20}
	if s := os.Getenv("CDC_REQUEST_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		seeds = []uint64{n}
	}
	for _, seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { announcements(t, seed) })
	}
}

func announcements(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, seed*7919))
	start := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	now := start
	f := &follower{values: map[string][]byte{}, read: map[string]bool{}}
	genuine := map[string]bool{}
	var ids []string // every id written to the topic, genuine or not
	write := func(r park.Request, real bool) {
		b, _ := json.Marshal(r)
		f.values[r.ID] = b
		f.read[r.ID] = rng.IntN(4) > 0 // the follower may not have read it yet
		genuine[r.ID] = real
		ids = append(ids, r.ID)
	}
	g := request.Gate{Now: func() time.Time { return now }}
	taken := map[string]int{}
	type announced struct {
		id string
		at time.Time
	}
	var past []announced
	lookupsAllowed := float64(request.LookupsPerSecond) // the bucket starts... empty, then fills
	lookupsAllowed = 0
	n := 0
	for step := 0; step < 3000; step++ {
		n++
		var id string
		at := now
		switch k := rng.IntN(100); {
		case k < 10: // the operator's request, announced at once
			id = fmt.Sprintf("redrive-op-%d", n)
			write(signed(id, now, key, "slot/1"), true)
		case k < 20 && len(ids) > 0: // any request written, announced again
			id = ids[rng.IntN(len(ids))]
		case k < 25: // forged: another key
			id = fmt.Sprintf("redrive-forged-%d", n)
			write(signed(id, now, otherKey, "slot/1"), false)
		case k < 28: // for another pipeline
			id = fmt.Sprintf("redrive-other-%d", n)
			write(signed(id, now, key, "slot/2"), false)
		case k < 31: // old, announced long after
			id = fmt.Sprintf("redrive-old-%d", n)
			write(signed(id, now.Add(-checkpoint.RequestMaxAge-time.Second-time.Duration(rng.IntN(3600))*time.Second), key, "slot/1"), false)
		case k < 33: // garbage in the topic
			id = fmt.Sprintf("redrive-garbage-%d", n)
			f.values[id], f.read[id] = []byte(`{"id":`), rng.IntN(2) == 0
			ids = append(ids, id)
		case k < 90: // a flood of ids nobody wrote
			id = fmt.Sprintf("redrive-flood-%d", rng.IntN(5000))
		default: // the empty id, and an announcement read again (a rewind, a restart), at its commit time
			if rng.IntN(2) == 0 || len(past) == 0 {
				id = ""
			} else {
				a := past[rng.IntN(len(past))]
				id, at = a.id, a.at
			}
		}
		past = append(past, announced{id, at})
		lookupsBefore := f.lookups
		req, err := request.Admit(context.Background(), &g, f, redrive, admission(id, at, map[string]bool{id: taken[id] > 0}))
		var refused *request.Refused
		switch {
		case err == nil:
			taken[id]++
			if !genuine[req.ID] || req.ID != id {
				t.Fatalf("step %d: admitted %q, which is not the operator's", step, id)
			}
			if taken[id] > 1 {
				t.Fatalf("step %d: %q ran twice", step, id)
			}
		case !errors.As(err, &refused):
			t.Fatalf("step %d: %q: %v, neither admitted nor refused", step, id, err)
		}
		if d := f.lookups - lookupsBefore; d > 1 {
			t.Fatalf("step %d: %d looks at the topic's end for one announcement", step, d)
		}
		// The clock: most announcements come in bursts, a few after a pause.
		if rng.IntN(10) == 0 {
			now = now.Add(time.Duration(rng.IntN(3000)) * time.Millisecond)
		}
	}
	elapsed := now.Sub(start).Seconds()
	lookupsAllowed += float64(request.LookupsPerSecond)*elapsed + 1
	if float64(f.lookups) > lookupsAllowed {
		t.Fatalf("%d looks at the topic's end in %.0f s; the budget allows %.0f", f.lookups, elapsed, lookupsAllowed)
	}
	// Every genuine request announced at once was admitted, unless the
	// flood had used the budget when it came and the follower had not
	// read it: those the operator runs again, as the log says.
	for id, real := range genuine {
		if real && taken[id] == 0 && f.read[id] {
			t.Errorf("the operator's request %s, read by the follower, was never admitted", id)
		}
	}
}
