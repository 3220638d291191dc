package redrive

import (
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/park"
)

var testKey = []byte("0123456789abcdef0123456789abcdef")

// parked is a parked record as a session produces it (relay.produceParked):
// numbered by its run, sealed; id names the event.
func parked(episode, run string, n int64, id string) *kgo.Record {
	r := &kgo.Record{Topic: "parked", Key: []byte("k"), Value: []byte(id), Headers: []kgo.RecordHeader{
		{Key: "dead_letter_event_id", Value: []byte(id)},
		{Key: park.HeaderEpisode, Value: []byte(episode)},
		{Key: park.HeaderSeq, Value: park.Seq(run, n)},
	}}
	park.Seal(r, testKey, "slot/1")
	return r
}

// history is a generated life of one parking: sessions that park records
// and get their checkpoint written or crash before, rewinds that cut it,
// other parkings' records and forged ones beside it, then records lost in
// Kafka. want is the events the parking holds, in order, by the
// checkpoint's own word; lost the ones of them deleted.
type history struct {
	p    checkpoint.Parked
	log  []*kgo.Record
	want []string
	lost map[string]bool
}

func generate(rng *rand.Rand) history {
	h := history{p: checkpoint.Parked{Episode: "ep"}, lost: map[string]bool{}}
	// state: what the checkpoint says; owner: which event each number
	// has, in it.
	var owner []string
	event := 0
	for s := 0; s < 2+rng.IntN(6); s++ {
		run := fmt.Sprintf("run%d", s)
		state, own := h.p, slices.Clone(owner)
		parkedAny := false
		for k := rng.IntN(8); k > 0; k-- {
			if !parkedAny {
				state.Runs = append(slices.Clone(state.Runs), checkpoint.Run{ID: run, From: state.Events + 1})
				parkedAny = true
			}
			n := state.Events + 1
			event++
			id := fmt.Sprintf("e%d", event)
			h.log = append(h.log, parked("ep", run, n, id))
			state.Events = n
			own = append(own[:n-1], id)
			// Beside it: other parkings, and records someone forged.
			switch rng.IntN(6) {
			case 0:
				h.log = append(h.log, parked("other", run, n, "x"))
			case 1:
				f := parked("ep", run, n+1, "forged")
				f.Value = []byte("changed")
				h.log = append(h.log, f)
			}
		}
		switch rng.IntN(4) {
		case 0: // a crash before its checkpoint: the records stay, as ghosts
		case 1: // a rewind after it: the parking cut
			h.p, owner = state, own
			if h.p.Events > 0 {
				cut := int64(rng.IntN(int(h.p.Events) + 1))
				h.p.Events, owner = cut, owner[:cut]
				h.p.Runs = slices.DeleteFunc(slices.Clone(h.p.Runs), func(r checkpoint.Run) bool { return r.From > cut })
			}
		default:
			h.p, owner = state, own
		}
	}
	h.want = owner
	// Kafka loses some records: retention, compaction, DeleteRecords.
	if rng.IntN(3) == 0 {
		kept := h.log[:0:0]
		for _, r := range h.log {
			if rng.IntN(5) == 0 {
				if id := string(r.Value); slices.Contains(h.want, id) && header(r, park.HeaderEpisode) == "ep" {
					h.lost[id] = true
				}
				continue
			}
			kept = append(kept, r)
		}
		h.log = kept
	}
	return h
}

// TestWalkFindsExactlyTheParking: whatever the history of a parking
// (sessions that crashed, rewinds, other parkings and forged records
// beside it, records lost), the walk takes exactly its events, in their
// order, each once, and counts what is missing: nothing more, nothing
// less. CDC_WALK_SEED picks one history to replay.
func TestWalkFindsExactlyTheParking(t *testing.T) {
	from, to := uint64(1), uint64(2000)
	if s := os.Getenv("CDC_WALK_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		from, to = n, n
	}
	r := &Runner{Keys: [][]byte{testKey}, Key: "slot/1", Log: hclog.NewNullLogger()}
	for seed := from; seed <= to; seed++ {
		h := generate(rand.New(rand.NewPCG(seed, 17)))
		w := r.newWalk(&h.p)
		var got []string
		for _, rec := range h.log {
			if _, ours := w.take(rec); ours {
				got = append(got, string(rec.Value))
			}
		}
		w.end()
		var want []string
		for _, id := range h.want {
			if !h.lost[id] {
				want = append(want, id)
			}
		}
		if !slices.Equal(got, want) || w.lost != int64(len(h.lost)) {
			t.Fatalf("seed %d: took %v, want %v; %d missing (%s), want %d\nparking %+v", seed, got, want, w.lost, w.spans(), len(h.lost), h.p)
		}
	}
}

// TestWalkAfterReleased: a redrive that sent records 1 to Released (and
// committed that) resumes after them.
func TestWalkAfterReleased(t *testing.T) {
	r := &Runner{Keys: [][]byte{testKey}, Key: "slot/1"}
	p := checkpoint.Parked{Episode: "ep", Events: 4, Released: 2, Runs: []checkpoint.Run{{ID: "a", From: 1}}}
	w := r.newWalk(&p)
	var got []int64
	for n := int64(1); n <= 4; n++ {
		if m, ours := w.take(parked("ep", "a", n, fmt.Sprint(n))); ours {
			got = append(got, m)
		}
	}
	if w.end(); !slices.Equal(got, []int64{3, 4}) || w.lost != 0 {
		t.Fatalf("took %v, %d missing; want 3 and 4", got, w.lost)
	}
}
