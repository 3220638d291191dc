package backfill

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// slowSession is an aheadSession whose wait for room takes pause: Kafka
// slow to acknowledge.
type slowSession struct {
	aheadSession
	pause time.Duration
}

func (s *slowSession) WaitRoom(ctx context.Context, n int, bytes int64) error {
	time.Sleep(s.pause) // the span under test: a backfill slower than the statement timeout
	return s.aheadSession.WaitRoom(ctx, n, bytes)
}

// TestCopyOutlivesTheStatementTimeout: a first start's copy is one
// statement for every row, held back while Kafka takes them: a backfill
// that takes longer than backfill.statement_timeout is not cancelled by
// it, and sends every row once, in order. The rows (20 MB) are more than
// the socket's buffers hold, so the server still runs the copy when the
// timeout would have fired; with the setting left on, it fails.
func TestCopyOutlivesTheStatementTimeout(t *testing.T) {
	db, r := outboxWith20(t, false)
	testenv.Exec(t, db, `DELETE FROM outbox`,
		`INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
		SELECT 'order', 'a' || (i % 3), lpad(i::text, 6, '0'), jsonb_build_object('pad', repeat('x', 100000)) FROM generate_series(1, 200) i`)
	r.StatementTimeout = 300 * time.Millisecond
	r.ChunkBytes = 500_000 // five rows a chunk
	r.MaxInFlightBytes = 64 << 20
	r.Tables[0].Backfill = &outbox.BackfillOptions{ChunkSize: 1000}
	var want []string
	for i := 1; i <= 200; i++ {
		want = append(want, fmt.Sprintf("%06d", i))
	}
	s := &slowSession{pause: 30 * time.Millisecond}
	started := time.Now()
	job := checkpoint.Job{ID: "first", Table: "public.outbox", Initial: true}
	if err := r.FirstStart(context.Background(), s, []checkpoint.Job{job}, exportSnapshot(t, db), 1); err != nil {
		t.Fatalf("a backfill of %s, longer than the statement timeout %s: %v", time.Since(started).Round(time.Millisecond), r.StatementTimeout, err)
	}
	if took := time.Since(started); took < 2*r.StatementTimeout {
		t.Fatalf("the backfill took %s: not long enough to test the statement timeout", took)
	}
	if !slices.Equal(s.types, want) {
		t.Fatalf("sent %d rows %v; want each of the 200 once, in order", len(s.types), s.types)
	}
}

// TestCopySavesWhole: with one-row commits, every save after a chunk is
// after a whole commit, and a copied job says so (the copy reads the row
// after each chunk before handing it out): resumed, it would not send the
// last commit again, as the cursor's read ahead does not. Found by the
// attack on the copy.
func TestCopySavesWhole(t *testing.T) {
	db, r := outboxWith20(t, false)
	testenv.Exec(t, db, `DELETE FROM outbox`)
	for i := range 30 {
		testenv.Exec(t, db, fmt.Sprintf(`INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('order', 'a', '%06d', '{}')`, i))
	}
	r.StatusInterval = time.Nanosecond // a save after every chunk
	r.MaxInFlightBytes = 64 << 20
	r.Tables[0].Backfill = &outbox.BackfillOptions{ChunkSize: 4}
	s := &aheadSession{}
	job := checkpoint.Job{ID: "first", Table: "public.outbox", Initial: true}
	if err := r.FirstStart(context.Background(), s, []checkpoint.Job{job}, exportSnapshot(t, db), 1); err != nil {
		t.Fatal(err)
	}
	mid := 0
	for _, sv := range s.saves {
		if sv.sent > 0 && sv.sent < 30 {
			mid++
			if !sv.whole {
				t.Fatalf("saved after %d one-row commits, not whole (saves %v)", sv.sent, s.saves)
			}
		}
	}
	if mid < 5 {
		t.Fatalf("%d saves before the end: the check above checked little (saves %v)", mid, s.saves)
	}
}

// TestCopyFirstRowTimeoutAndItsRemedy: a first start whose sorted read
// sends no row within backfill.statement_timeout (a condition slow on
// every row) fails with a line naming the setting and what to do, having
// sent nothing; raised, as it says, the same first start sends every row
// once, in order.
func TestCopyFirstRowTimeoutAndItsRemedy(t *testing.T) {
	db, r := outboxWith20(t, false)
	slow := `(SELECT count(*) FROM pg_catalog.generate_series(1, 200000 + pg_catalog.length(id::text))) > 0`
	r.Tables[0].Backfill = &outbox.BackfillOptions{Where: slow}
	r.StatementTimeout = 50 * time.Millisecond
	// Counted already (a first start interrupted after its count): the
	// copy is the statement the timeout meets.
	job := checkpoint.Job{ID: "first", Table: "public.outbox", Where: slow, Initial: true, Total: 20}
	s := &aheadSession{}
	err := r.FirstStart(context.Background(), s, []checkpoint.Job{job}, exportSnapshot(t, db), 1)
	if err == nil || !strings.Contains(err.Error(), "sent no row within backfill.statement_timeout (50ms)") || !strings.Contains(err.Error(), "raise backfill.statement_timeout") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("a sort slower than the statement timeout: %v", err)
	}
	if len(s.types) != 0 {
		t.Fatalf("sent %d events before the read's first row", len(s.types))
	}
	r.StatementTimeout = time.Minute
	s = &aheadSession{}
	if err := r.FirstStart(context.Background(), s, []checkpoint.Job{job}, exportSnapshot(t, db), 1); err != nil {
		t.Fatalf("with the timeout raised: %v", err)
	}
	if len(s.types) != 20 {
		t.Fatalf("with the timeout raised, sent %d events, want the 20 rows", len(s.types))
	}
}
