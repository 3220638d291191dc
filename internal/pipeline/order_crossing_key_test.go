package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/outboxcdc/cdc/internal/errtext"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// TestOneTransactionOfOneKeyInTwoTables (found by the attack on issue
// 53): the unit of order on a topic is the record key, and with
// expressions.key (docs/config.md's own example, "so that a customer's
// events share a partition") events of distinct aggregates share one. One
// transaction writes customer cust-0's events 0..3 alternately into two
// tables, each with its own aggregate id. The merged first start checked
// aggregates and sent them table by table (0 2 1 3 on the key's
// partition); it stops now, naming the key.
func TestOneTransactionOfOneKeyInTwoTables(t *testing.T) {
	e, _, tables := crossingEnv(t, 2, func(int) int { return 10 })
	for _, tb := range e.cfg.Tables {
		tb.Key = ""
		tb.Expressions = outbox.Expressions{Key: `payload.agg`}
	}
	conn := testenv.Connect(t, e.db)
	ctx := context.Background()
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for seq := range 4 {
		var id string
		if err := tx.QueryRow(ctx, `INSERT INTO `+tables[seq%2]+` (aggregatetype, aggregateid, type, payload) VALUES ('order', $1, 'Seq', $2) RETURNING id::text`,
			fmt.Sprintf("order-%d", seq), seqPayload("cust-0", seq)).Scan(&id); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	err = waitFatal(t, e.launch(t, ioDiscard{}))
	if !errors.As(err, new(*errtext.Fatal)) || !strings.Contains(err.Error(), `record key "cust-0"`) {
		t.Fatalf("got %v; want the stop that names record key cust-0", err)
	}
}
