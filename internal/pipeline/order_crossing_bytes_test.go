package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/errtext"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// TestCrossingStopsOnBytesWithItsRemedy (found by the attack on issue
// 53): one transaction writes 5 rows of 10 KB into one table and one row
// into another, distinct aggregates, with max_in_flight_bytes at 1 MiB:
// the commit's rows run past the table's byte budget (a sixteenth of
// max_in_flight_bytes, halved between the two tables) though not its
// chunk_size. The stop says to raise max_in_flight_bytes, not chunk_size
// (which moves nothing); done as said, every event goes, in order.
func TestCrossingStopsOnBytesWithItsRemedy(t *testing.T) {
	e, kafka, tables := crossingEnv(t, 2, func(int) int { return 10 })
	e.cfg.MaxInFlightBytes = 1 << 20 // chunks of 64 KiB, 32 KiB a table
	conn := testenv.Connect(t, e.db)
	ctx := context.Background()
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	pad := strings.Repeat("x", 10000)
	insert := func(table, agg string, seq int) {
		var id string
		if err := tx.QueryRow(ctx, `INSERT INTO `+table+` (aggregatetype, aggregateid, type, payload) VALUES ('order', $1, 'Seq', $2) RETURNING id::text`,
			agg, fmt.Sprintf(`{"agg": %q, "seq": %d, "pad": %q}`, agg, seq, pad)).Scan(&id); err != nil {
			t.Fatal(err)
		}
		want[id] = true
	}
	for seq := range 5 {
		insert(tables[0], "agg-a", seq)
	}
	insert(tables[1], "agg-b", 0)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	err = waitFatal(t, e.launch(t, ioDiscard{}))
	if !errors.As(err, new(*errtext.Fatal)) || !strings.Contains(err.Error(), "raise max_in_flight_bytes") {
		t.Fatalf("got %v; want the stop that says to raise max_in_flight_bytes", err)
	}
	t.Logf("first stop: %v", err)
	e.cfg.MaxInFlightBytes = 16 << 20 // 512 KiB a table
	r := e.launch(t, ioDiscard{})
	c := kafka.NewConsumer(t, kafka.AllTopics())
	var stopped error
	c.WaitFor(t, 2*time.Minute, "the events or a stop", func(recs []*kgo.Record) bool {
		select {
		case err := <-r.done:
			close(r.done)
			stopped = fmt.Errorf("%v", err)
			return true
		default:
		}
		return len(ids(recs)) >= len(want)
	})
	if stopped != nil {
		t.Fatalf("after the remedy the error named (max_in_flight_bytes 16 MiB) the start stops again: %v", stopped)
	}
	expectFirstArrivalsInOrder(t, c, want, want)
}
