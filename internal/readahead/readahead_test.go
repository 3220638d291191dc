package readahead

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
)

// TestHandsOutEveryRowOnceInOrder: over generated sequences of reads (0 to
// 30 rows each, the last one empty or not, some ending in an error) and
// pieces of 1 to 12 rows, Next hands out every row once, in the order read,
// at most a piece at a time, says last exactly on the last piece, and
// returns the error after the rows read before it; no two reads run at
// once, and a read begins only once the rows of the one before are taken
// (at most one read ahead); Pending is the rows not handed out yet.
func TestHandsOutEveryRowOnceInOrder(t *testing.T) {
	for seed := uint64(1); seed <= 300; seed++ {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) { handOut(t, seed) })
	}
}

var errRead = errors.New("the read failed (test)")

func handOut(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 7))
	reads := 1 + rng.IntN(8)
	failAt := -1
	if rng.IntN(4) == 0 {
		failAt = rng.IntN(reads)
	}
	var sizes []int
	total := 0
	for i := range reads {
		n := rng.IntN(31)
		if i == reads-1 && rng.IntN(3) == 0 {
			n = 0
		}
		sizes = append(sizes, n)
		total += n
	}
	piece := 1 + rng.IntN(12)
	var running, done, taken atomic.Int32
	row := 0
	r := New(func() ([][][]byte, bool, error) {
		if running.Add(1) != 1 {
			t.Errorf("two reads at once")
		}
		defer running.Add(-1)
		i := int(done.Load())
		if i > int(taken.Load())+1 {
			t.Errorf("read %d began with %d reads' rows taken: more than one read ahead", i, taken.Load())
		}
		defer done.Add(1)
		if i == failAt {
			return nil, false, errRead
		}
		var rows [][][]byte
		for range sizes[i] {
			rows = append(rows, [][]byte{[]byte(fmt.Sprint(row))})
			row++
		}
		return rows, i == reads-1, nil
	}, piece)
	defer r.Wait()
	want := 0
	for calls := 0; ; calls++ {
		if calls > total+reads+1 {
			t.Fatalf("no last piece after %d calls", calls)
		}
		before := int(done.Load())
		rows, last, err := r.Next()
		if before < int(done.Load()) || len(rows) > 0 {
			taken.Store(int32(min(int(done.Load()), reads)))
		}
		if err != nil {
			if !errors.Is(err, errRead) || failAt < 0 {
				t.Fatalf("error %v, none expected", err)
			}
			wantRows := 0
			for _, n := range sizes[:failAt] {
				wantRows += n
			}
			if want != wantRows {
				t.Fatalf("the error came after %d rows, want after the %d read before it", want, wantRows)
			}
			return
		}
		if len(rows) > piece {
			t.Fatalf("a piece of %d rows, want at most %d", len(rows), piece)
		}
		for _, rw := range rows {
			if got := string(rw[0]); got != fmt.Sprint(want) {
				t.Fatalf("row %s handed out, want %d", got, want)
			}
			want++
		}
		pending, pendingLast := r.Pending()
		if len(pending) > 0 && string(pending[0][0]) != fmt.Sprint(want) {
			t.Fatalf("Pending starts at row %s, want %d", pending[0][0], want)
		}
		if last {
			if failAt >= 0 {
				t.Fatalf("last, but read %d was to fail", failAt)
			}
			if want != total || !pendingLast || len(pending) != 0 {
				t.Fatalf("last after %d rows of %d (pending %d)", want, total, len(pending))
			}
			return
		}
		if want == total && failAt < 0 && len(rows) == 0 {
			t.Fatalf("every row handed out and an empty piece that is not the last")
		}
	}
}
