package backfill

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/decode"
	"github.com/outboxcdc/cdc/internal/testenv"
)

var pg *testenv.Postgres

func TestMain(m *testing.M) { testenv.Main(m, &pg) }

// session collects what the first start's backfill sends: a copy of
// each message, which Session.Event may not keep.
type session struct{ events []*decode.Message }

func (s *session) Begin(time.Time) error { return nil }
func (s *session) Event(m *decode.Message) error {
	c := *m
	s.events = append(s.events, &c)
	return nil
}
func (s *session) Commit(pglogrepl.LSN, time.Time)            {}
func (s *session) WaitRoom(context.Context, int, int64) error { return nil }
func (s *session) Save(context.Context, checkpoint.Job) error { return nil }
func (s *session) Working()                                   {}

// TestRewriteAfterTheSnapshot: a table rewritten after the snapshot a
// backfill reads was taken reads as empty in it (rewrites are not
// MVCC-safe), so the first start's backfill and a repair's snapshot fail,
// to be tried again, instead of sending none of its rows without a word.
// Plain and partitioned; VACUUM FULL too, which keeps the rows' xids but
// cannot be told apart by the files.
func TestRewriteAfterTheSnapshot(t *testing.T) {
	for _, tc := range []struct {
		name        string
		partitioned bool
		rewrite     string
	}{
		{"volatile default", false, "ALTER TABLE outbox ADD COLUMN r float8 DEFAULT random()"},
		{"type", false, "ALTER TABLE outbox ALTER COLUMN payload TYPE text"},
		{"vacuum full", false, "VACUUM FULL outbox"},
		{"partitioned", true, "ALTER TABLE outbox ADD COLUMN r float8 DEFAULT random()"},
		{"one leaf", true, "VACUUM FULL outbox_1"},
		{"none", false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db, r := outboxWith20(t, tc.partitioned)
			ctx := context.Background()
			// The slot's snapshot, exported before the rewrite, as a first
			// start's is before its backfill reads.
			snap := exportSnapshot(t, db)
			if tc.rewrite != "" {
				testenv.Exec(t, db, tc.rewrite)
			}
			s := &session{}
			err := r.FirstStart(ctx, s, []checkpoint.Job{{ID: "first", Table: "public.outbox", Initial: true}}, snap, 1)
			if tc.rewrite == "" {
				if err != nil || len(s.events) != 20 {
					t.Fatalf("first start without a rewrite: %d events, %v; want 20, no error", len(s.events), err)
				}
			} else if err == nil || !strings.Contains(err.Error(), "was rewritten") {
				t.Fatalf("first start after %q: %d events, error %v; want an error naming the rewrite", tc.rewrite, len(s.events), err)
			}

			// A repair's snapshot, opened now: no rewrite since.
			sn, err := r.OpenSnapshot(ctx, testTable())
			if err != nil {
				t.Fatalf("a snapshot opened after the rewrite: %v", err)
			}
			defer sn.Close(ctx)
			if sn.Total != 20 {
				t.Fatalf("the snapshot holds %d rows; want 20", sn.Total)
			}
		})
	}
}
