package pipeline_test

import (
	"context"
	"testing"
	"time"

	"github.com/outboxcdc/cdc/internal/testenv"
)

// TestRepairHeldByNoInheritingTable (found by an attack): the recreated
// outbox has a child (no outbox) that a long transaction writes to. The
// repair's LOCK TABLE took the children too (no ONLY), waited on the
// child, gave up after a second and repaired without holding the
// outbox's writers off, and an aggregate's events across the two tables
// came out of their commit order (seq 3 after seq 4). It locks the
// outbox ONLY, and keeps the order (TestRepairWhereTheTableJoined's
// check).
func TestRepairHeldByNoInheritingTable(t *testing.T) {
	e, kafka, tables := crossingEnv(t, 2, func(int) int { return 10 })
	for _, tb := range e.cfg.Tables {
		tb.Backfill = nil
	}
	e.cfg.Postgres.CatalogCheckInterval = 100 * time.Millisecond
	e.start(t)
	c := kafka.NewConsumer(t, kafka.AllTopics())
	conn := testenv.Connect(t, e.db)
	ctx := context.Background()
	older, err := testenv.Connect(t, e.db).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer older.Rollback(ctx)
	if _, err := older.Exec(ctx, `SELECT pg_current_xact_id()`); err != nil {
		t.Fatal(err)
	}
	want, seq := map[string]bool{}, 0
	testenv.Exec(t, e.db, recreateSQL, `CREATE TABLE kid () INHERITS (outbox)`)
	// A writer of the child, not of the outbox.
	if _, err := older.Exec(ctx, `INSERT INTO kid (aggregatetype, aggregateid, type, payload) VALUES ('order', 'zzz', 'kid', '{}')`); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		want[insertSeqInto(t, conn, "outbox", "agg-0", seq)] = true
		seq++
	}
	testenv.Eventually(t, 30*time.Second, "the new table published", func() bool {
		var n int
		testenv.QueryRow(t, e.db, `SELECT count(*) FROM pg_publication_tables WHERE pubname = 'outbox_cdc' AND tablename = 'outbox'`, nil, &n)
		return n == 1
	})
	for i := range 4 {
		want[insertSeqInto(t, conn, tables[i%2], "agg-0", seq)] = true
		seq++
	}
	if err := older.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	want[insertSeqInto(t, conn, tables[1], "agg-0", seq)] = true
	waitForIDs(t, c, want)
	c.SettleConfirmed(t, time.Minute, e.db, "outbox_cdc")
	expectCommitOrder(t, c, want)
}
