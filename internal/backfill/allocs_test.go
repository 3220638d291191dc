package backfill

import (
	"bytes"
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/decode"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// countSession counts the events a first start sends and checks each
// one's type, without keeping the message: what the real session does
// (package session's msg), so that the allocations measured are the
// backfill's own.
type countSession struct {
	t    *testing.T
	sent int
	// seen marks each row's payload "i" as sent: 20,000 copies of one
	// row (rows sharing value slices) would pass a count.
	seen []bool
}

func (s *countSession) Begin(time.Time) error { return nil }
func (s *countSession) Event(m *decode.Message) error {
	if string(m.Event.Fields[outbox.FieldEventType].B) != "OrderCreated" || len(m.Event.Fields[outbox.FieldPayload].B) < 200 {
		s.t.Errorf("event %d: type %q, payload %q", s.sent, m.Event.Fields[outbox.FieldEventType].B, m.Event.Fields[outbox.FieldPayload].B)
	}
	i := payloadI(m.Event.Fields[outbox.FieldPayload].B)
	switch {
	case i <= 0 || i >= len(s.seen):
		s.t.Errorf("event %d: no row's payload: %.60q", s.sent, m.Event.Fields[outbox.FieldPayload].B)
	case s.seen[i]:
		s.t.Errorf("event %d: row %d sent again", s.sent, i)
	default:
		s.seen[i] = true
	}
	s.sent++
	return nil
}

// payloadI is the "i" of a payload {"i": n, ...}, or -1.
func payloadI(p []byte) int {
	const at = `{"i": `
	if !bytes.HasPrefix(p, []byte(at)) {
		return -1
	}
	n := 0
	for _, c := range p[len(at):] {
		if c < '0' || c > '9' {
			return n
		}
		n = n*10 + int(c-'0')
	}
	return -1
}
func (s *countSession) Commit(pglogrepl.LSN, time.Time)            {}
func (s *countSession) WaitRoom(context.Context, int, int64) error { return nil }
func (s *countSession) Save(context.Context, checkpoint.Job) error { return nil }
func (s *countSession) Working()                                   {}

// TestBackfillAllocationsPerRow pins what a first start's read allocates
// for each row it sends, each row sent once (its own values, not another
// row's), up to the session: the row's bytes, one
// allocation, which the event's values alias (decode.RowDecoder.Row),
// and the chunk's share of its rows' value slices, cut from one. The
// message each row decodes into was a heap allocation of its own (483
// bytes, a third of a backfill's bytes allocated), and each row's value
// slices another: three allocations a row (3.08 measured), and the
// allocator and the GC took a quarter of the connector's CPU in
// BenchmarkBackfill (docs/benchmarks.md, "Backfill allocations").
func TestBackfillAllocationsPerRow(t *testing.T) {
	const rows = 20_000
	db, r := outboxWith20(t, false)
	testenv.Exec(t, db, `DELETE FROM outbox`,
		`INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
		 SELECT 'order', 'agg-' || (i % 1000), 'OrderCreated', jsonb_build_object('i', i, 'pad', repeat('x', 200))
		 FROM generate_series(1, 20000) i`)
	r.MaxInFlight = 4096
	snap := exportSnapshot(t, db)
	s := &countSession{t: t, seen: make([]bool, rows+1)}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	err := r.FirstStart(context.Background(), s, []checkpoint.Job{{ID: "first", Table: "public.outbox", Initial: true}}, snap, 1)
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	if s.sent != rows {
		t.Fatalf("sent %d events, want %d", s.sent, rows)
	}
	// A first start's fixed cost (connections, the plan, the count)
	// is some thousands of allocations, spread over 20,000 rows.
	if per := float64(after.Mallocs-before.Mallocs) / rows; per > 1.5 {
		t.Fatalf("%.2f allocations per row sent; the budget is 1.5 (the row's bytes, and a share of the chunk's)", per)
	}
}
