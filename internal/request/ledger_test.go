package request

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outboxcdc/cdc/internal/checkpoint"
)

// TestLedgerForgetsNoYoungRequest pins that the ledger never forgets a
// request taken within LedgerKeeps, however small its byte share: the old
// go first, then the young ones' outcomes are cut, and when the young ones
// alone have no room Room says so (Admit refuses the new request) instead
// of a young one being dropped and, announced again, run twice.
func TestLedgerForgetsNoYoungRequest(t *testing.T) {
	now := time.Now()
	l := Ledger{MaxBytes: 2048}
	outcome := strings.Repeat("o", checkpoint.MaxOutcome)
	// Old requests, past LedgerKeeps: they go first.
	for i := 0; i < 3; i++ {
		l.Take(checkpoint.Used{ID: fmt.Sprintf("redrive-old-%d", i), At: now.Add(-LedgerKeeps - time.Minute), Outcome: outcome})
	}
	taken := 0
	for i := 0; l.Room(fmt.Sprintf("redrive-%016d", i), now); i++ {
		id := fmt.Sprintf("redrive-%016d", i)
		l.Take(checkpoint.Used{ID: id, At: now, Outcome: outcome})
		taken++
		for j := 0; j <= i; j++ {
			if !l.Taken(fmt.Sprintf("redrive-%016d", j)) {
				t.Fatalf("after %d requests taken now, the ledger forgot the one taken %d-th", i+1, j+1)
			}
		}
		if l.Used[len(l.Used)-1].Outcome != outcome {
			for _, u := range l.Used {
				if u.Outcome == outcome {
					t.Fatalf("the newest request's outcome was cut before %s's", u.ID)
				}
			}
		}
	}
	if taken < 8 {
		t.Fatalf("a share of 2048 bytes has room for %d young requests only, want their outcomes cut to make room", taken)
	}
	if l.Taken("redrive-old-0") {
		t.Fatal("a request older than LedgerKeeps kept while young ones' outcomes were cut")
	}
	if !l.Room("redrive-later", now.Add(LedgerKeeps)) {
		t.Fatal("no room LedgerKeeps later, when every request taken is old")
	}
	// No byte bound: MaxUsed is the count the young may reach.
	l = Ledger{}
	for i := 0; i < checkpoint.MaxUsed; i++ {
		id := fmt.Sprint(i)
		if !l.Room(id, now) {
			t.Fatalf("no room for the %d-th request", i+1)
		}
		l.Take(checkpoint.Used{ID: id, At: now})
	}
	if l.Room("one more", now) {
		t.Fatalf("room for a request past MaxUsed (%d) young ones", checkpoint.MaxUsed)
	}
}

// TestAdmitRefusesWithoutRoomInTheLedger pins that a verified request the
// ledger has no room for is refused, saying to run the command later,
// rather than taken and a young one forgotten.
func TestAdmitRefusesWithoutRoomInTheLedger(t *testing.T) {
	var g Gate
	kind := Kind[made]{Name: "redrive", Parse: func(string, []byte) (made, error) { return made{}, nil }}
	_, err := Admit(context.Background(), &g, held{}, kind, Admission{ID: "redrive-3f0c9a1d2b7e4c55", At: time.Now(), Keys: [][]byte{[]byte("k")},
		Blocking: func(fn func() error) error { return fn() }, Room: func(string, time.Time) bool { return false }})
	if r, ok := err.(*Refused); !ok || r.Quiet || !strings.Contains(r.Msg, "too many requests were taken") {
		t.Fatalf("a request without room in the ledger: %v, want a refusal saying too many were taken", err)
	}
}

// held is a Follower that holds every request, read.
type held struct{}

func (held) Read(string) bool { return true }
func (held) Get(context.Context, string) ([]byte, bool, error) {
	return []byte("{}"), true, nil
}
