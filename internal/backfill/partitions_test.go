package backfill

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/decode"
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

// attachingSession attaches a partition with rows of its own to the
// outbox as the first event arrives: while the first start's job reads.
type attachingSession struct {
	session
	t      *testing.T
	db     string
	attach []string
	saved  []checkpoint.Job
}

func (s *attachingSession) Event(m *decode.Message) error {
	if len(s.events) == 0 {
		testenv.Exec(s.t, s.db, s.attach...)
	}
	return s.session.Event(m)
}

func (s *attachingSession) Save(_ context.Context, j checkpoint.Job) error {
	s.saved = append(s.saved, j)
	return nil
}

// lateAttachCase is a table partitioned by aggregatetype with 20 rows in
// its one leaf, and a table of 5 rows of its own (outbox_late) to attach
// while a job reads; r runs its jobs, in orderBy's order.
func lateAttachCase(t *testing.T, orderBy []string) (db string, r *Runner) {
	t.Helper()
	db = pg.NewDatabase(t)
	testenv.Exec(t, db, `CREATE TABLE outbox (id uuid NOT NULL DEFAULT gen_random_uuid(), seq bigserial, aggregatetype text NOT NULL,
		aggregateid text NOT NULL, type text NOT NULL, payload jsonb, PRIMARY KEY (id, aggregatetype)) PARTITION BY LIST (aggregatetype)`,
		`CREATE TABLE outbox_order PARTITION OF outbox FOR VALUES IN ('order')`,
		`INSERT INTO outbox (aggregatetype, aggregateid, type, payload) SELECT 'order', 'a' || i, 'E', '{}' FROM generate_series(1, 20) i`,
		`CREATE TABLE outbox_late (LIKE outbox INCLUDING DEFAULTS)`,
		`INSERT INTO outbox_late (aggregatetype, aggregateid, type, payload) SELECT 'late', 'l' || i, 'E', '{}' FROM generate_series(1, 5) i`)
	tbl := testTable()
	tbl.Backfill = &outbox.BackfillOptions{OrderBy: orderBy, ChunkSize: 4}
	return db, &Runner{Postgres: postgres.Config{URL: db}, Tables: []*outbox.Source{tbl}, MaxInFlight: 1000, StatusInterval: time.Hour, ChunkBytes: 1 << 20, Log: hclog.NewNullLogger(), Metrics: metrics.New("test")}
}

// TestPartitionAttachedWhileTheFirstStartReads: rows a partition brings
// when it is attached were written outside the outbox (docs/design.md,
// "Partitions"), and are never sent. A partition attached while the first
// start's job read, after its snapshot (ATTACH takes no lock the read
// holds), was read by the next chunk: its rows were committed before the
// snapshot, so the snapshot shows them, and 5 rows never written as events
// were sent. The job reads the leaves its snapshot shows, and keeps them,
// so that a job continued beside the stream does not read the partition
// either; in either order (keyset chunks with order_by, a cursor in
// commit order).
func TestPartitionAttachedWhileTheFirstStartReads(t *testing.T) {
	for _, orderBy := range [][]string{{"seq"}, nil} {
		t.Run(fmt.Sprintf("order_by %v", orderBy), func(t *testing.T) {
			db, r := lateAttachCase(t, orderBy)
			snap := exportSnapshot(t, db)
			s := &attachingSession{t: t, db: db, attach: []string{`ALTER TABLE outbox ATTACH PARTITION outbox_late FOR VALUES IN ('late')`}}
			// The job names its relation, as the pipeline's first start does.
			var rel uint32
			if err := testenv.Connect(t, db).QueryRow(context.Background(), "SELECT 'outbox'::regclass::oid").Scan(&rel); err != nil {
				t.Fatal(err)
			}
			if err := r.FirstStart(context.Background(), s, []checkpoint.Job{{ID: "first", Table: "public.outbox", Initial: true, Rel: rel}}, snap, 1); err != nil {
				t.Fatalf("first start: %v", err)
			}
			var late int
			for _, m := range s.events {
				if strings.HasPrefix(string(m.Event.Fields[outbox.FieldAggregateID].B), "l") {
					late++
				}
			}
			if len(s.events) != 20 || late != 0 {
				t.Fatalf("first start with a partition attached while it read: %d events, %d of the attached partition's; want the 20 of the outbox's own", len(s.events), late)
			}
			if len(s.saved) == 0 || len(s.saved[len(s.saved)-1].Leaves) != 1 {
				t.Fatalf("the job saved %+v; want it to keep the one leaf its snapshot shows", s.saved)
			}
			// The job continued beside the stream reads those leaves only.
			job := s.saved[len(s.saved)-1]
			job.After, job.Finished = nil, time.Time{}
			conn, err := postgres.ConnectRows(context.Background(), r.Postgres, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(context.Background())
			plan, _, err := r.plan(context.Background(), conn, job)
			if err != nil {
				t.Fatal(err)
			}
			if n, err := plan.Count(context.Background(), conn); err != nil || n != 20 {
				t.Fatalf("the job's plan beside the stream counts %d rows (%v); want the 20 of the leaf it kept", n, err)
			}
		})
	}
}

// lateOutbox: a list-partitioned outbox with 20 rows in outbox_order, and
// outbox_late, a table not yet attached, with 5 rows written outside the
// outbox (aggregate ids l1..l5).
func lateOutbox(t *testing.T) (string, *Runner, uint32) {
	t.Helper()
	db, r := lateAttachCase(t, nil)
	var rel uint32
	if err := testenv.Connect(t, db).QueryRow(context.Background(), "SELECT 'outbox'::regclass::oid").Scan(&rel); err != nil {
		t.Fatal(err)
	}
	return db, r, rel
}

// besideTheStream reads every row job's plan reads beside the stream (a
// fresh cursor in commit order), and counts those of the attached
// partition (aggregate ids l...).
func besideTheStream(t *testing.T, r *Runner, job checkpoint.Job) (all, late int) {
	t.Helper()
	ctx := context.Background()
	conn, err := postgres.ConnectRows(ctx, r.Postgres, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	plan, dec, err := r.plan(ctx, conn, job)
	if err != nil {
		t.Fatal(err)
	}
	cur, err := plan.Open(ctx, conn, job.After, job.Horizon, job.Whole)
	if err != nil {
		t.Fatal(err)
	}
	defer cur.Close(ctx)
	for {
		c, err := cur.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, row := range c.Rows {
			m, err := dec.Row(row, 1, time.Now())
			if err != nil {
				t.Fatal(err)
			}
			all++
			if strings.HasPrefix(string(m.Event.Fields[outbox.FieldAggregateID].B), "l") {
				late++
			}
		}
		if c.Final {
			return all, late
		}
	}
}

// failingSession attaches outbox_late as the first event arrives (while
// the first start reads, as TestPartitionAttachedWhileTheFirstStartReads
// does), then fails its first wait for room: Kafka went away during the
// first chunk, before the job's progress was ever saved.
type failingSession struct {
	attachingSession
}

func (s *failingSession) WaitRoom(context.Context, int, int64) error {
	return errors.New("kafka: broker not available")
}

// TestInterruptedFirstStartKeepsItsLeaves (found by an attack): the job's
// leaves reached the checkpoint only with its first save (after
// status_interval, once acked). A first start interrupted before that left
// the job without them; continued beside the stream, it read every leaf
// the table had, the one attached while the first start read included,
// and sent its 5 rows that were never written as events. The leaves are
// saved before anything is read.
func TestInterruptedFirstStartKeepsItsLeaves(t *testing.T) {
	db, r, rel := lateOutbox(t)
	snap := exportSnapshot(t, db)
	s := &failingSession{attachingSession{t: t, db: db, attach: []string{`ALTER TABLE outbox ATTACH PARTITION outbox_late FOR VALUES IN ('late')`}}}
	saved := checkpoint.Job{ID: "first-start:public.outbox", Table: "public.outbox", Initial: true, Rel: rel}
	err := r.FirstStart(context.Background(), s, []checkpoint.Job{saved}, snap, 1)
	if err == nil {
		t.Fatal("first start: want the Kafka error")
	}
	// The next session continues the checkpoint's job beside the stream:
	// the job as the first start saved it, before it read anything.
	if len(s.saved) == 0 || len(s.saved[0].Leaves) != 1 || s.saved[0].Rows != 0 {
		t.Fatalf("the first start saved %+v; want the job with its one leaf before it sent anything", s.saved)
	}
	all, late := besideTheStream(t, r, s.saved[len(s.saved)-1])
	if all != 20 || late != 0 {
		t.Fatalf("the job continued beside the stream reads %d rows, %d of them the attached partition's (written outside the outbox, never events); want 20, none of those", all, late)
	}
}

// TestAttachBeforeTheLockKeepsTheSnapshotsLeaves (found by an attack): a
// partition attached after the slot's snapshot and before the first
// start's job locks the table fails HoldFiles, and the job continues
// beside the stream: it did so without leaves, and read the attached
// partition's rows. The leaves are the snapshot's, saved before the lock.
func TestAttachBeforeTheLockKeepsTheSnapshotsLeaves(t *testing.T) {
	db, r, rel := lateOutbox(t)
	snap := exportSnapshot(t, db)
	testenv.Exec(t, db, `ALTER TABLE outbox ATTACH PARTITION outbox_late FOR VALUES IN ('late')`)
	s := &attachingSession{t: t, db: db}
	saved := checkpoint.Job{ID: "first-start:public.outbox", Table: "public.outbox", Initial: true, Rel: rel}
	err := r.FirstStart(context.Background(), s, []checkpoint.Job{saved}, snap, 1)
	if err == nil || !strings.Contains(err.Error(), "attached or detached") {
		t.Fatalf("first start: %v; want HoldFiles' error", err)
	}
	if len(s.saved) == 0 || len(s.saved[0].Leaves) != 1 {
		t.Fatalf("the first start saved %+v; want the job with the one leaf its snapshot shows", s.saved)
	}
	all, late := besideTheStream(t, r, s.saved[len(s.saved)-1])
	if all != 20 || late != 0 {
		t.Fatalf("the job continued beside the stream reads %d rows, %d of them the attached partition's; want 20, none of those", all, late)
	}
}

// TestLeafSwappedForACopyLosesNoRow (found by an attack): a leaf swapped
// for a copy (copy, detach, attach the copy, drop) while a first start's
// job is unfinished: the job kept the old leaf's oid, which no longer
// exists, and beside the stream read none of the copy's rows: 10 of the 20
// rows committed before the slot were never sent. A job whose leaves are
// not all in the table any more reads every leaf it has, saying so.
func TestLeafSwappedForACopyLosesNoRow(t *testing.T) {
	db, r := outboxWith20(t, true)
	var rel uint32
	if err := testenv.Connect(t, db).QueryRow(context.Background(), "SELECT 'outbox'::regclass::oid").Scan(&rel); err != nil {
		t.Fatal(err)
	}
	snap := exportSnapshot(t, db)
	s := &attachingSession{t: t, db: db}
	if err := r.FirstStart(context.Background(), s, []checkpoint.Job{{ID: "first", Table: "public.outbox", Initial: true, Rel: rel}}, snap, 1); err != nil {
		t.Fatal(err)
	}
	job := s.saved[len(s.saved)-1]
	if len(job.Leaves) != 2 {
		t.Fatalf("leaves %v", job.Leaves)
	}
	// As if interrupted before any chunk was acked.
	job.After, job.Finished, job.Rows = nil, time.Time{}, 0
	testenv.Exec(t, db, "CREATE TABLE outbox_1n (LIKE outbox_1 INCLUDING ALL)", "INSERT INTO outbox_1n SELECT * FROM outbox_1",
		"ALTER TABLE outbox DETACH PARTITION outbox_1", "ALTER TABLE outbox ATTACH PARTITION outbox_1n FOR VALUES WITH (MODULUS 2, REMAINDER 1)", "DROP TABLE outbox_1")
	all, _ := besideTheStream(t, r, job)
	if all != 20 {
		t.Fatalf("after a leaf was swapped for a copy, the job beside the stream reads %d of the 20 rows committed before the slot, and ends", all)
	}
}

// TestAdoptedJobKeepsItsLeaves: the job of a slot adopted without a
// checkpoint keeps the leaves its first snapshot shows, as a first
// start's does: a partition attached while it reads, with rows written
// outside the outbox, brings none of them. Before, the job had no leaves
// and each chunk in keyset order read every leaf the table had by then
// (5 of 25 events the attached partition's rows).
func TestAdoptedJobKeepsItsLeaves(t *testing.T) {
	for _, orderBy := range [][]string{{"seq"}, nil} {
		t.Run(fmt.Sprintf("order_by %v", orderBy), func(t *testing.T) {
			db, r := lateAttachCase(t, orderBy)
			s := &attachingSession{t: t, db: db, attach: []string{`ALTER TABLE outbox ATTACH PARTITION outbox_late FOR VALUES IN ('late')`}}
			job := checkpoint.Job{ID: firstStartPrefix + "public.outbox", Table: "public.outbox", Started: time.Now()}
			if err := r.Continue(context.Background(), s, []checkpoint.Job{job}, 1); err != nil {
				t.Fatalf("continue: %v", err)
			}
			var late int
			for _, m := range s.events {
				if strings.HasPrefix(string(m.Event.Fields[outbox.FieldAggregateID].B), "l") {
					late++
				}
			}
			if late != 0 {
				t.Fatalf("the adopted slot's job, continued before the stream with a partition attached while it read: %d events, %d of them the attached partition's rows, never written as events", len(s.events), late)
			}
			if len(s.events) != 20 {
				t.Fatalf("%d events; want the 20 rows", len(s.events))
			}
		})
	}
}
