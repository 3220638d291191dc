package pipeline_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// TestFirstStartThroughReusedFreeSpace (found by the attack on issue 53):
// an outbox table whose rows were deleted here and there (by a poller, or
// by the connector's own retention) and vacuumed has free space in its
// early pages. One transaction then writes aggregate agg-0's events
// 0..199, the first larger than any page's free space: it goes to a new
// page, the next ones after it until that page is full, and the rest into
// the free space of the early pages. Read as they lie in the table, the
// later events went first; read in the order of their commands, they go
// as written.
func TestFirstStartThroughReusedFreeSpace(t *testing.T) {
	e := newEnv(t, testenv.NewKafka(t))
	testenv.Exec(t, e.db, `INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
		SELECT 'filler', 'f', 'F', jsonb_build_object('pad', repeat(md5(i::text), 6)) FROM generate_series(1, 2000) i`)
	testenv.Exec(t, e.db, `DELETE FROM outbox WHERE ctid IN (SELECT ctid FROM outbox WHERE (ctid::text::point)[1]::int % 12 = 0)`)
	testenv.Exec(t, e.db, `VACUUM outbox`)
	e.cfg.Tables[0].Backfill = &outbox.BackfillOptions{ChunkSize: 1000, Where: "aggregateid = 'agg-0'"}
	conn := testenv.Connect(t, e.db)
	ctx := context.Background()
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	for seq := range 200 {
		payload := seqPayload("agg-0", seq)
		if seq == 0 {
			var pad string
			if err := tx.QueryRow(ctx, `SELECT string_agg(md5(i::text), '') FROM generate_series(1, 45) i`).Scan(&pad); err != nil {
				t.Fatal(err)
			}
			payload = fmt.Sprintf(`{"agg": "agg-0", "seq": 0, "pad": %q}`, pad)
		}
		var id string
		if err := tx.QueryRow(ctx, `INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('order', 'agg-0', 'Seq', $1) RETURNING id::text`, payload).Scan(&id); err != nil {
			t.Fatal(err)
		}
		want[id] = true
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var pages string
	testenv.QueryRow(t, e.db, `SELECT string_agg(((ctid::text::point)[0]::int)::text, ' ' ORDER BY (payload->>'seq')::int) FROM outbox WHERE aggregateid = 'agg-0'`, nil, &pages)
	t.Logf("page of each event, by seq: %s", pages)
	e.launch(t, ioDiscard{})
	expectFirstArrivalsInOrder(t, e.kafka.NewConsumer(t, e.kafka.AllTopics()), want, want)
}

// TestFirstStartOfOneTransactionAcrossPartitions (found by the attack on
// issue 53): in the suite's partitionedSchema (February is
// hash-subpartitioned by id), one transaction writes agg-0's events 0..9,
// which land in the two hash partitions at random. Their positions are
// each partition's own: read as they lie, the two were interleaved.
func TestFirstStartOfOneTransactionAcrossPartitions(t *testing.T) {
	e := newEnv(t, testenv.NewKafka(t))
	testenv.Exec(t, e.db, partitionedSchema)
	e.cfg.Tables[0].Backfill = &outbox.BackfillOptions{ChunkSize: 50}
	conn := testenv.Connect(t, e.db)
	ctx := context.Background()
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	for seq := range 10 {
		var id string
		if err := tx.QueryRow(ctx, `INSERT INTO outbox (created_at, aggregatetype, aggregateid, type, payload) VALUES ('2026-02-10', 'order', 'agg-0', 'Seq', $1) RETURNING id::text`,
			seqPayload("agg-0", seq)).Scan(&id); err != nil {
			t.Fatal(err)
		}
		want[id] = true
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var parts string
	testenv.QueryRow(t, e.db, `SELECT string_agg(tableoid::regclass::text || ':' || (payload->>'seq'), ' ' ORDER BY (payload->>'seq')::int) FROM outbox`, nil, &parts)
	t.Logf("rows by partition: %s", parts)
	e.launch(t, ioDiscard{})
	c := e.kafka.NewConsumer(t, e.kafka.AllTopics())
	expectFirstArrivalsInOrder(t, c, want, want)
}
