package backfill

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/metrics"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/postgres"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// outboxWith20 makes public.outbox (partitioned by hash in two leaves,
// outbox_0 and outbox_1, when partitioned) with 20 rows, and a Runner
// for it.
func outboxWith20(t *testing.T, partitioned bool) (string, *Runner) {
	t.Helper()
	db := pg.NewDatabase(t)
	by := ""
	if partitioned {
		by = "PARTITION BY HASH (id)"
	}
	testenv.Exec(t, db, `CREATE TABLE outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregatetype text NOT NULL,
		aggregateid text NOT NULL, type text NOT NULL, payload jsonb) `+by)
	if partitioned {
		testenv.Exec(t, db, `CREATE TABLE outbox_0 PARTITION OF outbox FOR VALUES WITH (MODULUS 2, REMAINDER 0)`,
			`CREATE TABLE outbox_1 PARTITION OF outbox FOR VALUES WITH (MODULUS 2, REMAINDER 1)`)
	}
	testenv.Exec(t, db, `INSERT INTO outbox (aggregatetype, aggregateid, type, payload) SELECT 'order', 'a' || i, 'E', '{}' FROM generate_series(1, 20) i`)
	return db, &Runner{Postgres: postgres.Config{URL: db}, Tables: []*outbox.Source{testTable()}, MaxInFlight: 1000, StatusInterval: time.Second, ChunkBytes: 1 << 20, Log: hclog.NewNullLogger(), Metrics: metrics.New("test")}
}

// exportSnapshot exports a snapshot from a repeatable-read transaction
// that stays open, as the slot's is for a first start.
func exportSnapshot(t *testing.T, db string) string {
	t.Helper()
	ctx := context.Background()
	exporter := testenv.Connect(t, db)
	var snap string
	if _, err := exporter.Exec(ctx, "BEGIN ISOLATION LEVEL REPEATABLE READ"); err != nil {
		t.Fatal(err)
	}
	if err := exporter.QueryRow(ctx, "SELECT pg_export_snapshot()").Scan(&snap); err != nil {
		t.Fatal(err)
	}
	return snap
}

// TestPartitionsChangedAfterTheSnapshot: a read plans its leaves from the
// catalog as it is now, and DETACH and ATTACH are not MVCC-safe, so a
// partition detached after the slot's snapshot (its rows in the outbox as
// the snapshot shows it) was not read, and one attached since read as
// empty: the first start sent 10 of 20 rows without a word. It fails
// instead, to read the table beside the stream, as a rewrite does; so
// does a table created again under the outbox's name.
func TestPartitionsChangedAfterTheSnapshot(t *testing.T) {
	for _, tc := range []struct {
		name        string
		partitioned bool
		change      []string
		want        string
	}{
		{"detached, and attached back after", true, []string{"ALTER TABLE outbox DETACH PARTITION outbox_1"}, "public.outbox_1 was created again, attached or detached"},
		{"a leaf swapped for a copy", true, []string{"CREATE TABLE outbox_1n (LIKE outbox_1 INCLUDING ALL)", "INSERT INTO outbox_1n SELECT * FROM outbox_1",
			"ALTER TABLE outbox DETACH PARTITION outbox_1", "ALTER TABLE outbox ATTACH PARTITION outbox_1n FOR VALUES WITH (MODULUS 2, REMAINDER 1)", "DROP TABLE outbox_1"}, "outbox_1n was created again, attached or detached"},
		{"created again", false, []string{"ALTER TABLE outbox RENAME TO outbox_old", "CREATE TABLE outbox (LIKE outbox_old INCLUDING ALL)", "INSERT INTO outbox SELECT * FROM outbox_old"}, "public.outbox was created again, attached or detached"},
		{"none", true, nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db, r := outboxWith20(t, tc.partitioned)
			ctx := context.Background()
			snap := exportSnapshot(t, db)
			testenv.Exec(t, db, tc.change...)
			s := &session{}
			err := r.FirstStart(ctx, s, []checkpoint.Job{{ID: "first", Table: "public.outbox", Initial: true}}, snap, 1)
			if tc.want == "" {
				if err != nil || len(s.events) != 20 {
					t.Fatalf("first start, nothing changed: %d events, %v; want 20, no error", len(s.events), err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || len(s.events) != 0 {
				t.Fatalf("first start after %q: %d events, error %v; want none and an error saying %q", tc.change, len(s.events), err, tc.want)
			}
			if tc.name == "detached, and attached back after" {
				testenv.Exec(t, db, "ALTER TABLE outbox ATTACH PARTITION outbox_1 FOR VALUES WITH (MODULUS 2, REMAINDER 1)")
			}
			// The next try, in a snapshot of its own, reads all 20.
			sn, err := r.OpenSnapshot(ctx, testTable())
			if err != nil {
				t.Fatalf("a snapshot opened after the change: %v", err)
			}
			defer sn.Close(ctx)
			if sn.Total != 20 {
				t.Fatalf("the snapshot holds %d rows; want 20", sn.Total)
			}
		})
	}
}

// TestSnapshotWaitsForARewrite: a repair's snapshot is taken by its first
// catalog query, before it locks the table; a rewrite that held the lock
// and commits while the snapshot waits for it would read as an empty
// table, so opening the snapshot fails, to be tried again.
func TestSnapshotWaitsForARewrite(t *testing.T) {
	db, r := outboxWith20(t, false)
	ctx := context.Background()
	alter := testenv.Connect(t, db)
	if _, err := alter.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	if _, err := alter.Exec(ctx, "ALTER TABLE outbox ALTER COLUMN payload TYPE text"); err != nil {
		t.Fatal(err)
	}
	opened := make(chan error, 1)
	go func() {
		sn, err := r.OpenSnapshot(ctx, testTable())
		if err == nil {
			err = fmt.Errorf("opened, holding %d rows", sn.Total)
			sn.Close(ctx)
		}
		opened <- err
	}()
	testenv.WaitForLock(t, db, "public.outbox")
	if _, err := alter.Exec(ctx, "COMMIT"); err != nil {
		t.Fatal(err)
	}
	if err := <-opened; err == nil || !strings.Contains(err.Error(), "was rewritten") {
		t.Fatalf("a snapshot that waited for a rewrite: %v; want an error naming the rewrite", err)
	}
}
