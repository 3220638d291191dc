//go:build findings

// Findings of the attack on issue 53's detours (2026-12-02) not fixed yet:
// each test fails on the code as it is, and is kept so that the next
// change can be tried against it (go test -tags findings -run
// TestAttack ./internal/pipeline). CI does not build them. The closing
// note and docs/design.md say what each shows.

package pipeline_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// TestAttackBackfillAcrossTwoTables (rule 32): two configured outbox
// tables carry events of the same aggregates (same key, same topic). The
// first start's backfill runs one table's job, then the other's: an
// aggregate's rows come table by table, not in the order they were
// committed, although the stream orders them by commit.
func TestAttackBackfillAcrossTwoTables(t *testing.T) {
	kafka := testenv.NewFakeKafka(t)
	e := newEnv(t, kafka)
	testenv.Exec(t, e.db, `CREATE TABLE outbox2 (LIKE outbox INCLUDING ALL)`)
	t2 := *e.cfg.Tables[0]
	t2.Name = outbox.TableName{Schema: "public", Name: "outbox2"}
	e.cfg.Tables = append(e.cfg.Tables, &t2)
	for _, tb := range e.cfg.Tables {
		tb.Backfill = &outbox.BackfillOptions{ChunkSize: 10}
	}
	want := map[string]bool{}
	conn := testenv.Connect(t, e.db)
	for seq := 0; seq < 10; seq++ {
		for a := 0; a < 3; a++ {
			table := "outbox"
			if seq%2 == 1 {
				table = "outbox2"
			}
			agg := fmt.Sprintf("agg-%d", a)
			var id string
			if err := conn.QueryRow(context.Background(), `INSERT INTO `+table+` (aggregatetype, aggregateid, type, payload) VALUES ('order', $1, 'Seq', $2) RETURNING id::text`, agg, seqPayload(agg, seq)).Scan(&id); err != nil {
				t.Fatal(err)
			}
			want[id] = true
		}
	}
	e.start(t)
	expectFirstArrivalsInOrder(t, kafka.NewConsumer(t, kafka.AllTopics()), want, want)
}

