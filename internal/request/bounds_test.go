package request

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestRefusedIdsBoundedInBytes pins that the refused ids a Gate keeps for
// the pipeline's life are bounded in bytes, not only in count: any role
// may announce ids of any length, and 1,024 of 64 KiB must not keep 64
// MiB (here: at most MaxKept, the follower's own bound).
func TestRefusedIdsBoundedInBytes(t *testing.T) {
	var a Announced
	long := strings.Repeat("i", 64<<10)
	for i := 0; i < MaxRefused; i++ {
		a.Refuse("redrive", fmt.Sprintf("%d-%s", i, long))
	}
	kept := 0
	for id := range a.refused {
		kept += len(id)
	}
	if kept > MaxKept {
		t.Fatalf("the gate keeps %d refused ids of %d bytes in all (%d MiB), for the pipeline's life: bounded in count, not in bytes", len(a.refused), kept, kept>>20)
	}
	// Ids of at most MaxIDBytes are kept, within MaxRefusedBytes.
	id := func(i int) string { return fmt.Sprintf("%d-%s", i, strings.Repeat("i", MaxIDBytes))[:MaxIDBytes] }
	for i := 0; i < 3*MaxRefused; i++ {
		a.Refuse("redrive", id(i))
		if a.bytes > MaxRefusedBytes {
			t.Fatalf("%d bytes of refused ids kept, more than MaxRefusedBytes (%d)", a.bytes, MaxRefusedBytes)
		}
	}
	if !a.Refused("redrive", id(3*MaxRefused-1)) {
		t.Fatal("an id of MaxIDBytes refused last is not remembered")
	}
}

// TestAdmitRefusesLongIDsQuietly pins that an announced id longer than
// MaxIDBytes is refused quietly, before a look at the checkpoint topic and
// without a place among the refused.
func TestAdmitRefusesLongIDsQuietly(t *testing.T) {
	var g Gate
	f := lookups{}
	kind := Kind[made]{Name: "redrive", Parse: func(string, []byte) (made, error) { return made{}, nil }}
	_, err := Admit(context.Background(), &g, &f, kind, Admission{ID: "redrive-" + strings.Repeat("x", MaxIDBytes), At: time.Now(),
		Blocking: func(fn func() error) error { return fn() }})
	r, ok := err.(*Refused)
	if !ok || !r.Quiet {
		t.Fatalf("an id longer than MaxIDBytes: %v, want a quiet refusal", err)
	}
	if f.n != 0 || len(g.announced.refused) != 0 || g.Lookups != 0 {
		t.Fatalf("an id longer than MaxIDBytes cost %d look-ups and %d refused ids kept, want none", f.n, len(g.announced.refused))
	}
}

// lookups is a Follower that has read nothing and counts its looks.
type lookups struct{ n int }

func (f *lookups) Read(string) bool { return false }
func (f *lookups) Get(context.Context, string) ([]byte, bool, error) {
	f.n++
	return nil, false, nil
}

// made is a Signed that verifies and was made now.
type made struct{}

func (made) Verify([][]byte, string) bool { return true }
func (made) Made() time.Time              { return time.Now() }

// TestFollowerMemoryBoundedInBytesWithEmptyValues pins that the follower's
// bound counts the ids' bytes and a cost per entry, not only the values':
// records with empty values under the pipeline's request prefix, which
// anyone who may produce to the checkpoint topic can write, are forgotten
// past MaxKept too.
func TestFollowerMemoryBoundedInBytesWithEmptyValues(t *testing.T) {
	r := &Requests{got: map[string][]byte{}, next: map[int32]int64{}}
	long := strings.Repeat("x", 4096)
	n := 2 * MaxKept / len(long) // ids of twice MaxKept's bytes
	for i := 0; i < n; i++ {
		r.keep(fmt.Sprintf("redrive-%d-%s", i, long), []byte{})
	}
	kept := 0
	for id, v := range r.got {
		kept += len(id) + len(v)
	}
	if kept > MaxKept {
		t.Fatalf("the follower keeps %d requests of %d bytes (ids and values), more than MaxKept (%d): its bound counts only the values' bytes", len(r.got), kept, MaxKept)
	}
}

// TestFollowerOrderBoundedForOneIdWrittenAgain pins that a value replaced
// keeps its id's place: one id written again and again (by anyone with
// produce rights on the checkpoint topic) does not grow the follower's
// order, nor do ids written and tombstoned in turn.
func TestFollowerOrderBoundedForOneIdWrittenAgain(t *testing.T) {
	r := &Requests{got: map[string][]byte{}, next: map[int32]int64{}}
	for i := 0; i < 100000; i++ {
		r.keep("redrive-same", []byte("x"))
	}
	if len(r.order) > len(r.got) {
		t.Fatalf("after one id written 100000 times the follower's order holds %d entries for %d requests kept: it grows with every record, not with what it keeps", len(r.order), len(r.got))
	}
	for i := 0; i < 100000; i++ {
		r.keep("redrive-again", []byte("x"))
		r.keep("redrive-again", nil)
	}
	if len(r.order) > 2*len(r.got)+64 {
		t.Fatalf("after one id written and tombstoned 100000 times the follower's order holds %d entries for %d requests kept", len(r.order), len(r.got))
	}
	if _, ok := r.got["redrive-same"]; !ok || r.bytes != len("redrive-same")+1+keptOverhead {
		t.Fatalf("the follower keeps %v, %d bytes; want redrive-same alone", r.got, r.bytes)
	}
}

// TestLookupThatDoesNotAnswerInTimeIsARefusal pins that an announced id
// the follower cannot look up within lookupTimeout (a checkpoint topic
// slow to read, any role announcing an id nobody wrote) is refused, its
// look's time charged to the budget, not an error that would end the session and meet the same
// announcement again in the next.
func TestLookupThatDoesNotAnswerInTimeIsARefusal(t *testing.T) {
	var g Gate
	kind := Kind[made]{Name: "redrive", Parse: func(string, []byte) (made, error) { return made{}, nil }}
	a := Admission{ID: "redrive-nobody-wrote-this", At: time.Now(), Blocking: func(fn func() error) error { return fn() }}
	start := time.Now()
	_, err := Admit(context.Background(), &g, lagging{}, kind, a)
	if r, ok := err.(*Refused); !ok || r.Quiet || !strings.Contains(r.Msg, "run the command again") {
		t.Fatalf("a look-up that does not answer in time: %v, want a refusal that says to run the command again", err)
	}
	if d := time.Since(start); d > lookupTimeout+time.Second {
		t.Fatalf("the look-up held the loop %s, more than lookupTimeout (%s)", d, lookupTimeout)
	}
	// Not remembered (the refusal says nothing of the request), but the
	// look's time was charged: announced again at once, it is refused
	// without another look.
	looks, again := g.Lookups, time.Now()
	if _, err := Admit(context.Background(), &g, lagging{}, kind, a); err == nil {
		t.Fatal("the same id announced again: admitted")
	} else if _, ok := err.(*Refused); !ok || g.Lookups != looks || time.Since(again) > time.Second {
		t.Fatalf("the same id announced again: %v after %d more looks, %s; want a refusal at once, without a look", err, g.Lookups-looks, time.Since(again))
	}
	// A session ending is still an error: the announcement is read again
	// (on a budget of its own: the slow look above charged this one's).
	g = Gate{}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	a.ID = "redrive-other"
	if _, err := Admit(ctx, &g, lagging{}, kind, a); err == nil {
		t.Fatal("a look-up ended by the session's end: refused, want an error")
	} else if _, ok := err.(*Refused); ok {
		t.Fatalf("a look-up ended by the session's end: %v, want an error, not a refusal", err)
	}
}

// lagging is a Follower that has read nothing and never reaches the
// topic's end.
type lagging struct{}

func (lagging) Read(string) bool { return false }
func (lagging) Get(ctx context.Context, _ string) ([]byte, bool, error) {
	<-ctx.Done()
	return nil, false, ctx.Err()
}

// slowLagging is a Follower that has read only the ids in read, and whose
// look-ups of the others take slow on clock (a follower far behind), then
// fail as lagging's do once their (short, real) deadline passes.
type slowLagging struct {
	clock *time.Time
	slow  time.Duration
	read  map[string]bool
	spent time.Duration
}

func (s *slowLagging) Read(id string) bool { return s.read[id] }
func (s *slowLagging) Get(ctx context.Context, id string) ([]byte, bool, error) {
	if s.read[id] {
		return []byte("x"), true, nil
	}
	*s.clock = s.clock.Add(s.slow)
	s.spent += s.slow
	<-ctx.Done()
	return nil, false, ctx.Err()
}

// TestFloodWhileTheFollowerLagsHoldsTheLoopAtMostHalf: ids nobody wrote,
// announced by any role while the requests follower lags, each cost a
// look-up that waits for lookupTimeout. The budget counted look-ups, not
// their time: 5 a second of 5 s each held the replication loop all the
// time (a stall for as long as the flood). The budget now charges the
// time a look-up took, so looks hold the loop at most half of it, for any
// flood's rate and any look-up's length; and a request the follower has
// read is still taken at once.
func TestFloodWhileTheFollowerLagsHoldsTheLoopAtMostHalf(t *testing.T) {
	kind := Kind[made]{Name: "backfill", Parse: func(string, []byte) (made, error) { return made{}, nil }}
	for _, tc := range []struct {
		every, slow time.Duration
	}{
		{time.Millisecond, 5 * time.Second},
		{10 * time.Millisecond, 5 * time.Second},
		{100 * time.Millisecond, time.Second},
		{300 * time.Millisecond, 200 * time.Millisecond},
		{time.Second, 2 * time.Second},
	} {
		// Real time at the start: a request is made (made.Made) now.
		clock := time.Now()
		start := clock
		f := &slowLagging{clock: &clock, slow: tc.slow, read: map[string]bool{"backfill-mine": true}}
		g := Gate{Now: func() time.Time { return clock }, LookupTimeout: time.Millisecond}
		for i := 0; clock.Sub(start) < 3*time.Minute; i++ {
			a := Admission{ID: fmt.Sprintf("backfill-forged-%d", i), At: clock, Blocking: func(fn func() error) error { return fn() }}
			if i%1000 == 999 {
				a.ID, a.At, a.Keys = "backfill-mine", time.Now(), [][]byte{[]byte("k")}
				if _, err := Admit(context.Background(), &g, f, kind, a); err != nil {
					t.Fatalf("a request the follower has read, in a flood: %v; want it taken", err)
				}
			} else if _, err := Admit(context.Background(), &g, f, kind, a); err == nil {
				t.Fatal("a forged id was admitted")
			}
			clock = clock.Add(tc.every)
		}
		if share := f.spent.Seconds() / clock.Sub(start).Seconds(); share > 0.55 {
			t.Errorf("ids every %s, look-ups of %s: look-ups held the loop %.0f%% of a 3-minute flood; want at most half", tc.every, tc.slow, 100*share)
		}
	}
}

// TestGenuineIDAnnouncedFirstByAnotherIsStillTaken: a
// principal who may read the checkpoint topic (docs/security.md: readable
// by principals the database is not) sees a genuine request's id as soon
// as the command writes it, and any role may announce it. Announced first,
// while the look-up budget is spent by a flood and the follower has not
// read it yet, it is refused for the budget and remembered as refused; the
// command's own announcement, once the follower has read the request, is
// was then refused quietly (not even logged). A refusal for the budget or
// a look's time is not remembered now, and an id the follower has read is
// looked at again whatever was refused of it before.
func TestGenuineIDAnnouncedFirstByAnotherIsStillTaken(t *testing.T) {
	kind := Kind[made]{Name: "backfill", Parse: func(string, []byte) (made, error) { return made{}, nil }}
	clock := time.Now()
	f := &slowLagging{clock: &clock, slow: 10 * time.Millisecond, read: map[string]bool{}}
	g := Gate{Now: func() time.Time { return clock }, LookupTimeout: time.Millisecond}
	blocking := func(fn func() error) error { return fn() }
	// The flood spends the budget.
	for i := 0; i < 20; i++ {
		_, _ = Admit(context.Background(), &g, f, kind, Admission{ID: fmt.Sprintf("backfill-forged-%d", i), At: clock, Blocking: blocking})
	}
	// The genuine id, announced by someone else before the follower read it.
	if _, err := Admit(context.Background(), &g, f, kind, Admission{ID: "backfill-genuine", At: clock, Blocking: blocking}); err == nil {
		t.Fatal("pre-announced: admitted")
	}
	// The follower reads it; the command announces it, a moment later.
	f.read["backfill-genuine"] = true
	clock = clock.Add(100 * time.Millisecond)
	_, err := Admit(context.Background(), &g, f, kind, Admission{ID: "backfill-genuine", At: time.Now(), Keys: [][]byte{[]byte("k")}, Blocking: blocking})
	if err != nil {
		r, _ := err.(*Refused)
		t.Fatalf("the command's announcement of a genuine request the follower has read: refused (quiet %v): %v; want it taken", r != nil && r.Quiet, err)
	}
}
