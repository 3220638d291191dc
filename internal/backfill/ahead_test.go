package backfill

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/decode"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// aheadSession records what a first start sends and the room it waits
// for, and fails the session at event failAt (0: never).
type aheadSession struct {
	types  []string
	bytes  []int64
	failAt int
	failed bool
	// saves are the jobs' progress as saved: the events sent by then,
	// and whether the job says their last one's commit was sent whole.
	saves []aheadSave
}

type aheadSave struct {
	sent  int
	whole bool
}

var errSessionDown = errors.New("the session ended (test)")

func (s *aheadSession) Begin(time.Time) error { return nil }
func (s *aheadSession) Event(m *decode.Message) error {
	if s.failAt > 0 && len(s.types)+1 == s.failAt {
		s.failed = true
		return errSessionDown
	}
	s.types = append(s.types, string(m.Event.Fields[outbox.FieldEventType].B))
	return nil
}
func (s *aheadSession) Commit(pglogrepl.LSN, time.Time) {}
func (s *aheadSession) WaitRoom(_ context.Context, n int, bytes int64) error {
	if n > 0 { // not the wait for everything sent (0, -1)
		s.bytes = append(s.bytes, bytes)
	}
	return nil
}
func (s *aheadSession) Save(_ context.Context, job checkpoint.Job) error {
	s.saves = append(s.saves, aheadSave{len(s.types), job.Whole})
	return nil
}
func (s *aheadSession) Working() {}

// TestReadAheadKeepsTheOrder: a first start's cursor reads its next
// chunk while the rows of one are sent (sendMerged). Over generated
// backlogs (transactions of 1 to 40 rows, payloads of 10 bytes to 300
// KB, chunks of 1 to 50 rows, budgets of 1 KB to 1 MB), every row is sent
// once, in the cursor's order (transaction, command, place: each row's
// type is its place in the order they were written), and the bytes in
// flight leave room for the chunk read ahead besides the one sent. The
// cursor's order is the server's (the rows of one statement share a
// command id, and lie where free space was: the order by place is not
// the order of the VALUES, docs/design.md, "Backfill"). A
// session that fails part-way returns its error, the read ahead ended
// (-race sees a read still on the connection as the test closes it).
func TestReadAheadKeepsTheOrder(t *testing.T) {
	for seed := uint64(1); seed <= 6; seed++ {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) { readAhead(t, seed) })
	}
}

func readAhead(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 56))
	db, r := outboxWith20(t, false)
	testenv.Exec(t, db, `DELETE FROM outbox`)
	n := 0
	txOf := map[string]int{} // each row's type: its transaction
	for tx := range 5 + rng.IntN(20) {
		var vals []string
		for range 1 + rng.IntN(40) {
			n++
			txOf[fmt.Sprintf("%06d", n)] = tx
			size := 10
			if rng.IntN(10) == 0 {
				size = 1 + rng.IntN(300_000)
			}
			vals = append(vals, fmt.Sprintf(`('order', 'a%d', '%06d', jsonb_build_object('pad', repeat('x', %d)))`, rng.IntN(5), n, size))
		}
		testenv.Exec(t, db, `INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES `+strings.Join(vals, ", "))
	}
	r.ChunkBytes = int64(1<<10 + rng.IntN(1<<20))
	r.StatusInterval = time.Nanosecond // progress saved after every chunk sent
	r.MaxInFlightBytes = 64 << 20
	chunk := 1 + rng.IntN(50)
	r.Tables[0].Backfill = &outbox.BackfillOptions{ChunkSize: chunk}
	// One statement a transaction, so the cursor's order is by
	// transaction, then place.
	var want []string
	testenv.QueryRow(t, db, `SELECT array_agg(type ORDER BY xmin::text::bigint, ctid) FROM outbox`, nil, &want)
	if len(want) != n {
		t.Fatalf("%d rows in the table, want %d", len(want), n)
	}
	for _, failAt := range []int{0, 1 + rng.IntN(n)} {
		snap := exportSnapshot(t, db)
		s := &aheadSession{failAt: failAt}
		job := checkpoint.Job{ID: "first", Table: "public.outbox", Initial: true}
		err := r.FirstStart(context.Background(), s, []checkpoint.Job{job}, snap, 1)
		if failAt > 0 {
			if !errors.Is(err, errSessionDown) {
				t.Fatalf("a session that failed at event %d: FirstStart returned %v", failAt, err)
			}
			if !slices.Equal(s.types, want[:failAt-1]) {
				t.Fatalf("before the session failed at event %d, sent %v; want %v", failAt, s.types, want[:failAt-1])
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(s.types, want) {
			t.Fatalf("chunks of %d rows, a budget of %d bytes: sent %v; want every row once, in order %v", chunk, r.ChunkBytes, s.types, want)
		}
		// A job saved whole resumes past its last row's commit: the rest
		// of that commit must have been sent (a chunk ends anywhere,
		// and a FETCH of several chunks holds the rows after it).
		wholes := 0
		for _, sv := range s.saves {
			if !sv.whole || sv.sent == 0 {
				continue
			}
			wholes++
			if last := s.types[sv.sent-1]; sv.sent < len(want) && txOf[want[sv.sent]] == txOf[last] {
				t.Fatalf("saved whole after %d events (the last %s), but %s of the same commit was not sent yet: a resume would skip it", sv.sent, last, want[sv.sent])
			}
		}
		if wholes == 0 {
			t.Fatalf("no save of %d said its commit was sent whole: the check above checked nothing", len(s.saves))
		}
		for _, b := range s.bytes {
			if b != r.MaxInFlightBytes-2*r.ChunkBytes {
				t.Fatalf("waited for room of %d bytes in flight; want max_in_flight_bytes less two chunks, %d", b, r.MaxInFlightBytes-2*r.ChunkBytes)
			}
		}
	}
}
