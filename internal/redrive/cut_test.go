package redrive

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pglogrepl"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/errtext"
	"github.com/outboxcdc/cdc/internal/park"
)

// parkedAt is a parked record of an event at lsn, as produceParked makes
// it: read marks a row read from the table (park.HeaderRead, before the
// seal).
func parkedAt(n int64, id string, lsn pglogrepl.LSN, read bool) *kgo.Record {
	r := &kgo.Record{Topic: "parked", Key: []byte("k"), Value: []byte(id), Headers: []kgo.RecordHeader{
		{Key: "dead_letter_event_id", Value: []byte(id)},
		{Key: park.HeaderEpisode, Value: []byte("ep")},
		{Key: park.HeaderSeq, Value: park.Seq("run", n)},
		{Key: park.HeaderLSN, Value: []byte(lsn.String())},
	}}
	if read {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: park.HeaderRead, Value: []byte("1")})
	}
	park.Seal(r, testKey, "slot/1")
	return r
}

// cutCase is a generated parking and a rewind: its events in order, each
// a row the stream carried (at rising commit LSNs) or one a backfill or a
// repair read from the table (at the LSN it read at: a first start's
// consistent point before the stream's, or a later backfill's position
// among them); some records lost in Kafka; a rewind position anywhere.
type cutCase struct {
	lsn  []pglogrepl.LSN
	read []bool
	lost map[int64]bool
	to   pglogrepl.LSN
}

func generateCut(rng *rand.Rand) cutCase {
	var c cutCase
	c.lost = map[int64]bool{}
	at := pglogrepl.LSN(1000)
	for i := 1 + rng.IntN(10); i > 0; i-- {
		at += pglogrepl.LSN(1 + rng.IntN(100))
		read := rng.IntN(3) == 0
		c.lsn, c.read = append(c.lsn, at), append(c.read, read)
	}
	if rng.IntN(3) == 0 {
		c.lost[int64(1+rng.IntN(len(c.lsn)))] = true
	}
	c.to = pglogrepl.LSN(900 + rng.IntN(int(at)-800))
	return c
}

// TestCutKeepsWhatNoStreamSendsAgain (rule 32): whatever the parking and
// the rewind's position, the cut either keeps every record the stream
// from the position does not carry again (those committed before it, and
// every row read from the table), in order, and gives up only records the
// stream carries again (so that, re-parked behind the cut, the key's
// events are all there, in order, none twice), or refuses with an error
// that names the key, when no cut can: a read record behind one the
// stream sends again, or a record missing from a parking with read ones.
// CDC_CUT_SEED replays one case.
func TestCutKeepsWhatNoStreamSendsAgain(t *testing.T) {
	from, to := uint64(1), uint64(3000)
	if s := os.Getenv("CDC_CUT_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		from, to = n, n
	}
	r := &Runner{Keys: [][]byte{testKey}, Key: "slot/1"}
	refused := 0
	for seed := from; seed <= to; seed++ {
		k := generateCut(rand.New(rand.NewPCG(seed, 29)))
		p := &checkpoint.Parked{Key: "K", Episode: "ep", Topic: "parked", Events: int64(len(k.lsn)), Runs: []checkpoint.Run{{ID: "run", From: 1}}}
		for _, read := range k.read {
			p.Read = p.Read || read
		}
		w, c := r.newWalk(p), &cutter{to: k.to}
		for i := range k.lsn {
			n := int64(i + 1)
			if k.lost[n] {
				continue
			}
			if m, ours := w.take(parkedAt(n, fmt.Sprint(n), k.lsn[i], k.read[i])); ours {
				c.take(m, parkedAt(n, fmt.Sprint(n), k.lsn[i], k.read[i]))
			}
		}
		w.end()
		cut, err := c.result(p, w)
		// resent: whether the stream from the position carries event n again.
		resent := func(n int64) bool { return !k.read[n-1] && k.lsn[n-1] >= k.to }
		if err != nil {
			var f *errtext.Fatal
			if !errors.As(err, &f) || !strings.Contains(err.Error(), `key "K"`) || !strings.Contains(err.Error(), "cdc redrive --key 'K'") {
				t.Fatalf("seed %d: refusal %q: want a one-line error naming the key and the redrive", seed, err)
			}
			// A refusal must be for a case no cut can keep: a read record
			// after one the stream sends again, or one missing with read
			// records in the parking.
			after := false
			for n := int64(1); n <= p.Events; n++ {
				after = after || (resent(n) && func() bool {
					for m := n + 1; m <= p.Events; m++ {
						if k.read[m-1] {
							return true
						}
					}
					return false
				}())
			}
			if !after && !(p.Read && len(k.lost) > 0) {
				t.Fatalf("seed %d: refused (%v) a rewind to %s of %+v that a cut could keep", seed, err, k.to, k)
			}
			refused++
			continue
		}
		// A record missing may be kept (as missing, for the redrive to
		// refuse), never given up unless the stream sends it again.
		for n := int64(1); n <= p.Events; n++ {
			if n <= cut && resent(n) && !k.lost[n] {
				t.Fatalf("seed %d: cut %d keeps event %d, which the stream from %s sends again (twice then): %+v", seed, cut, n, k.to, k)
			}
			if n > cut && !resent(n) {
				t.Fatalf("seed %d: cut %d gives up event %d (read %v, at %s), which no stream from %s sends again: lost; %+v", seed, cut, n, k.read[n-1], k.lsn[n-1], k.to, k)
			}
		}
	}
	if from != to && refused == 0 {
		t.Fatalf("no case was refused: the generator misses the class")
	}
}
