package wal_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pglogrepl"

	"github.com/outboxcdc/cdc/internal/postgres"
	"github.com/outboxcdc/cdc/internal/testenv"
	"github.com/outboxcdc/cdc/internal/wal"
)

// TestEndBetweenTransactions pins where Stream.End stops Run: after the
// COMMIT of the transaction it came in, without the BEGIN of the next
// one; at once between two transactions; and, when the COMMIT does not
// come within the grace, in the middle of the transaction.
func TestEndBetweenTransactions(t *testing.T) {
	const rows = 300
	db, c, from := slotted(t)
	// Two transactions of rows inserts each, in the WAL before the stream
	// starts: it reads the second at once after the first.
	for i := 0; i < 2; i++ {
		testenv.Exec(t, db, `INSERT INTO outbox (aggregatetype, aggregateid, type) SELECT 'a', 'b', 'c' FROM generate_series(1, 300)`)
	}

	type seen struct{ begins, inserts, commits atomic.Int64 }
	var runWith func(t *testing.T, acks wal.Acks, endAt func(s *wal.Stream, n *seen, data []byte), outside func(s *wal.Stream)) (*seen, error)
	// run streams both transactions with handle's endAt, and outside on
	// the test's goroutine, and returns what Run returned.
	run := func(t *testing.T, endAt func(s *wal.Stream, n *seen, data []byte), outside func(s *wal.Stream)) (*seen, error) {
		return runWith(t, &movingAcks{}, endAt, outside)
	}
	runWith = func(t *testing.T, acks wal.Acks, endAt func(s *wal.Stream, n *seen, data []byte), outside func(s *wal.Stream)) (*seen, error) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		// Status updates an hour apart: nothing but End wakes an idle loop.
		c := c
		c.StatusInterval = time.Hour
		s := openFree(t, ctx, c, from)
		n := &seen{}
		done := make(chan error, 1)
		go func() {
			done <- s.Run(ctx, func(_ pglogrepl.LSN, data []byte) error {
				switch data[0] {
				case 'B':
					n.begins.Add(1)
				case 'I':
					n.inserts.Add(1)
				case 'C':
					n.commits.Add(1)
				}
				endAt(s, n, data)
				return nil
			}, acks, nil)
		}()
		defer s.Close(context.Background(), acks)
		if outside != nil {
			outside(s)
		}
		// The bound on how soon Run ends: a minute from here, after
		// outside called End. A loop End did not wake would sleep until
		// its next status update, an hour away; one that waited for room
		// in Kafka past the grace, for ever.
		select {
		case err := <-done:
			return n, err
		case <-time.After(time.Minute):
			t.Fatal("Run did not end")
			return nil, nil
		}
	}

	t.Run("inside a transaction", func(t *testing.T) {
		n, err := run(t, func(s *wal.Stream, n *seen, data []byte) {
			if data[0] == 'I' && n.inserts.Load() == 1 {
				s.End(time.Hour)
			}
		}, nil)
		if !errors.Is(err, wal.ErrEnded) {
			t.Fatalf("Run returned %v, want ErrEnded", err)
		}
		if b, i, c := n.begins.Load(), n.inserts.Load(), n.commits.Load(); b != 1 || i != rows || c != 1 {
			t.Fatalf("handled %d BEGIN, %d INSERT, %d COMMIT; want the whole first transaction and nothing of the second: 1, %d, 1", b, i, c, rows)
		}
	})
	t.Run("between transactions", func(t *testing.T) {
		both := make(chan struct{})
		n, err := run(t, func(s *wal.Stream, n *seen, data []byte) {
			if data[0] == 'C' && n.commits.Load() == 2 {
				close(both)
			}
		}, func(s *wal.Stream) {
			select {
			case <-both:
			case <-time.After(time.Minute):
				t.Fatal("the two transactions were not streamed")
			}
			s.End(time.Hour)
		})
		if !errors.Is(err, wal.ErrEnded) {
			t.Fatalf("Run returned %v, want ErrEnded", err)
		}
		if c := n.commits.Load(); c != 2 {
			t.Fatalf("handled %d COMMIT, want 2", c)
		}
	})
	t.Run("past the grace", func(t *testing.T) {
		n, err := run(t, func(s *wal.Stream, n *seen, data []byte) {
			if data[0] == 'I' && n.inserts.Load() == 1 {
				s.End(10 * time.Millisecond)
			}
			if data[0] == 'I' {
				time.Sleep(time.Millisecond) // a slow transaction: 300 ms, past the grace
			}
		}, nil)
		if !errors.Is(err, wal.ErrEnded) {
			t.Fatalf("Run returned %v, want ErrEnded", err)
		}
		if c := n.commits.Load(); c != 0 || n.inserts.Load() >= rows {
			t.Fatalf("handled %d INSERT and %d COMMIT; want the transaction cut at the grace", n.inserts.Load(), c)
		}
	})
	t.Run("saturated inside a transaction", func(t *testing.T) {
		// Kafka does not answer: the loop waits for room inside the
		// transaction, and must wait for the grace's end, not spin.
		acks := &saturatedAcks{}
		n, err := runWith(t, acks, func(s *wal.Stream, n *seen, data []byte) {
			if data[0] == 'I' && n.inserts.Load() == 1 {
				acks.full.Store(true)
				s.End(300 * time.Millisecond)
			}
		}, nil)
		if !errors.Is(err, wal.ErrEnded) {
			t.Fatalf("Run returned %v, want ErrEnded", err)
		}
		if c, looks := n.commits.Load(), acks.looks.Load(); c != 0 || looks > 100 {
			t.Fatalf("%d COMMIT handled and the loop asked Saturated %d times while it waited: want the transaction cut at the grace, and a wait, not a spin", c, looks)
		}
	})
}

// saturatedAcks is movingAcks whose in-flight bound fills when full is
// set, and never frees: Kafka stopped answering.
type saturatedAcks struct {
	movingAcks
	full  atomic.Bool
	looks atomic.Int64
}

func (a *saturatedAcks) Saturated() bool {
	if !a.full.Load() {
		return false
	}
	a.looks.Add(1)
	return true
}

// openFree opens the stream once the slot is free: the walsender of the
// last subtest's stream lets it go a moment after its connection closed.
func openFree(t *testing.T, ctx context.Context, c postgres.Config, from pglogrepl.LSN) *wal.Stream {
	t.Helper()
	var s *wal.Stream
	testenv.Eventually(t, 30*time.Second, "the slot to be free of the last stream's walsender", func() bool {
		var err error
		s, err = wal.Open(ctx, c, from, hclog.NewNullLogger())
		if err != nil && !errors.As(err, new(*postgres.SlotInUseError)) {
			t.Fatal(err)
		}
		return err == nil
	})
	return s
}
