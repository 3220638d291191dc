package backfill

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pglogrepl"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/decode"
	"github.com/outboxcdc/cdc/internal/metrics"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/postgres"
	"github.com/outboxcdc/cdc/internal/testenv"
)

var pg *testenv.Postgres

func TestMain(m *testing.M) { testenv.Main(m, &pg) }

// session collects what the first start's backfill sends.
type session struct{ events []*decode.Message }

func (s *session) Begin(time.Time) error                      { return nil }
func (s *session) Event(m *decode.Message) error              { s.events = append(s.events, m); return nil }
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
	for _, tc := range []struct{ name, create, rewrite string }{
		{"volatile default", "", "ALTER TABLE outbox ADD COLUMN r float8 DEFAULT random()"},
		{"type", "", "ALTER TABLE outbox ALTER COLUMN payload TYPE text"},
		{"vacuum full", "", "VACUUM FULL outbox"},
		{"partitioned", "PARTITION BY HASH (id)", "ALTER TABLE outbox ADD COLUMN r float8 DEFAULT random()"},
		{"one leaf", "PARTITION BY HASH (id)", "VACUUM FULL outbox_1"},
		{"none", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := pg.NewDatabase(t)
			testenv.Exec(t, db, `CREATE TABLE outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregatetype text NOT NULL,
				aggregateid text NOT NULL, type text NOT NULL, payload jsonb) `+tc.create)
			if tc.create != "" {
				testenv.Exec(t, db, `CREATE TABLE outbox_0 PARTITION OF outbox FOR VALUES WITH (MODULUS 2, REMAINDER 0)`,
					`CREATE TABLE outbox_1 PARTITION OF outbox FOR VALUES WITH (MODULUS 2, REMAINDER 1)`)
			}
			testenv.Exec(t, db, `INSERT INTO outbox (aggregatetype, aggregateid, type, payload) SELECT 'order', 'a' || i, 'E', '{}' FROM generate_series(1, 20) i`)
			r := &Runner{Postgres: postgres.Config{URL: db}, Tables: []*outbox.Source{testTable()}, MaxInFlight: 1000, StatusInterval: time.Second, ChunkBytes: 1 << 20, Log: hclog.NewNullLogger(), Metrics: metrics.New("test")}
			ctx := context.Background()

			// The slot's snapshot, exported before the rewrite, as a first
			// start's is before its backfill reads.
			exporter := testenv.Connect(t, db)
			var snap string
			if _, err := exporter.Exec(ctx, "BEGIN ISOLATION LEVEL REPEATABLE READ"); err != nil {
				t.Fatal(err)
			}
			if err := exporter.QueryRow(ctx, "SELECT pg_export_snapshot()").Scan(&snap); err != nil {
				t.Fatal(err)
			}
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
