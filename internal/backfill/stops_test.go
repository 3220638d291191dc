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

// stopSession fails at event failAt of its run with an EventError (event
// true) or a session error, and records every save in full.
type stopSession struct {
	types  []string
	failAt int
	event  bool
	saves  []stopSave
}

type stopSave struct {
	sent int
	job  checkpoint.Job
}

func (s *stopSession) Begin(time.Time) error { return nil }
func (s *stopSession) Event(m *decode.Message) error {
	if s.failAt > 0 && len(s.types)+1 == s.failAt {
		if s.event {
			return &outbox.EventError{Table: "public.outbox", EventID: "x", Reason: "test"}
		}
		return errSessionDown
	}
	s.types = append(s.types, string(m.Event.Fields[outbox.FieldEventType].B))
	return nil
}
func (s *stopSession) Commit(pglogrepl.LSN, time.Time)            {}
func (s *stopSession) WaitRoom(context.Context, int, int64) error { return nil }
func (s *stopSession) Working()                                   {}
func (s *stopSession) Save(_ context.Context, job checkpoint.Job) error {
	job.After = slices.Clone(job.After)
	s.saves = append(s.saves, stopSave{len(s.types), job})
	return nil
}

// TestInterruptedFirstStartsLoseNoRow: a first start that stops part-way,
// on an invalid event (stopOnEvent saves what was sent) or a session that
// fails, and starts again from its last save, as many times as it takes,
// delivers every row: over generated backlogs (plain tables and hashed
// partitions), chunks, budgets and status intervals, and the reads of
// several chunks a FETCH handed out a chunk at a time, no save counts a
// row not sent or says a commit was sent whole before it was (Whole: the
// next start would skip the rest of it), and each run sends a run of the
// table's order.
func TestInterruptedFirstStartsLoseNoRow(t *testing.T) {
	for seed := uint64(1); seed <= 8; seed++ {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) { interruptedFirstStarts(t, seed) })
	}
}

func interruptedFirstStarts(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 99))
	db, r := outboxWith20(t, seed%2 == 0)
	testenv.Exec(t, db, `DELETE FROM outbox`)
	n := 0
	for range 5 + rng.IntN(20) {
		var vals []string
		for range 1 + rng.IntN(40) {
			n++
			size := 10
			if rng.IntN(10) == 0 {
				size = 1 + rng.IntN(300_000)
			}
			vals = append(vals, fmt.Sprintf(`('order', 'a%d', '%06d', jsonb_build_object('pad', repeat('x', %d)))`, rng.IntN(5), n, size))
		}
		testenv.Exec(t, db, `INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES `+strings.Join(vals, ", "))
	}
	r.ChunkBytes = int64(1<<10 + rng.IntN(1<<20))
	r.StatusInterval = time.Nanosecond
	if rng.IntN(2) == 0 {
		r.StatusInterval = time.Hour
	}
	r.MaxInFlightBytes = 64 << 20
	chunk := 1 + rng.IntN(50)
	r.Tables[0].Backfill = &outbox.BackfillOptions{ChunkSize: chunk}
	var want []string
	testenv.QueryRow(t, db, `SELECT array_agg(type ORDER BY xmin::text::bigint, ctid) FROM outbox`, nil, &want)
	delivered := map[string]bool{}
	job := checkpoint.Job{ID: "first-start:x", Table: "public.outbox", Initial: true}
	for run := 0; ; run++ {
		if run > 200 {
			t.Fatal("no end")
		}
		failAt := 0
		if run < 8 {
			failAt = 1 + rng.IntN(n)
		}
		s := &stopSession{failAt: failAt, event: rng.IntN(2) == 0}
		snap := exportSnapshot(t, db)
		err := r.FirstStart(context.Background(), s, []checkpoint.Job{job}, snap, 1)
		if err != nil && !errors.Is(err, errSessionDown) && !errors.As(err, new(*outbox.EventError)) {
			t.Fatal(err)
		}
		if seed%2 == 1 && len(s.types) > 0 {
			i := slices.Index(want, s.types[0])
			if i < 0 || i+len(s.types) > len(want) || !slices.Equal(want[i:i+len(s.types)], s.types) {
				t.Fatalf("run %d sent %v, not a run of the table's order", run, s.types)
			}
		}
		// What the last save counted is delivered; a run's later sends may not be.
		if len(s.saves) > 0 {
			last := s.saves[len(s.saves)-1]
			for _, ty := range s.types[:last.sent] {
				delivered[ty] = true
			}
			job = last.job
		}
		t.Logf("run %d: failAt %d event %v sent %d saves %d err %v; job After %v Whole %v Rows %d", run, failAt, s.event, len(s.types), len(s.saves), err != nil, job.After, job.Whole, job.Rows)
		if err == nil {
			if job.Finished.IsZero() {
				t.Fatal("ended without a finished save")
			}
			break
		}
	}
	for _, w := range want {
		if !delivered[w] {
			t.Fatalf("row %s was never delivered (chunk %d, budget %d)", w, chunk, r.ChunkBytes)
		}
	}
}
