package pipeline_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outboxcdc/cdc/internal/config"
	"github.com/outboxcdc/cdc/internal/errtext"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/route"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// crossingEnv is an env with n outbox tables of the same layout, each
// backfilled on the first start in chunks of chunk(i) rows.
func crossingEnv(t *testing.T, n int, chunk func(i int) int) (*env, *testenv.Kafka, []string) {
	t.Helper()
	kafka := testenv.NewFakeKafka(t)
	e := newEnv(t, kafka)
	tables := []string{"outbox"}
	for len(tables) < n {
		name := fmt.Sprintf("outbox%d", len(tables)+1)
		testenv.Exec(t, e.db, `CREATE TABLE `+name+` (LIKE outbox INCLUDING ALL)`)
		tb := *e.cfg.Tables[0]
		tb.Name = outbox.TableName{Schema: "public", Name: name}
		e.cfg.Tables = append(e.cfg.Tables, &tb)
		tables = append(tables, name)
	}
	for i, tb := range e.cfg.Tables {
		tb.Backfill = &outbox.BackfillOptions{ChunkSize: chunk(i)}
	}
	return e, kafka, tables
}

// insertSeqInto writes aggregate agg's event seq into table in q, and returns
// its id.
func insertSeqInto(t *testing.T, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, table, agg string, seq int) string {
	t.Helper()
	var id string
	if err := q.QueryRow(context.Background(), `INSERT INTO `+table+` (aggregatetype, aggregateid, type, payload) VALUES ('order', $1, 'Seq', $2) RETURNING id::text`, agg, seqPayload(agg, seq)).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

// TestOneTransactionInTwoTables (issue 53's attack; rule 32: where the
// commit order cannot be known, hold the key or stop, and say so): one
// transaction writes aggregate agg-0's events 0 to 3 into two outbox
// tables, interleaved. The rows of one transaction carry no position that
// compares across tables, and the first start's backfill sent them table
// by table (0 2 1 3). It stops now, naming the aggregate and the tables,
// before sending any of them; backfill.on_unknown_order: send, the
// remedy its error names, sends them all. A transaction that writes
// distinct aggregates into the two tables goes through in order.
func TestOneTransactionInTwoTables(t *testing.T) {
	for _, shared := range []bool{true, false} {
		t.Run(fmt.Sprintf("shared=%v", shared), func(t *testing.T) {
			e, kafka, tables := crossingEnv(t, 2, func(int) int { return 10 })
			conn := testenv.Connect(t, e.db)
			ctx := context.Background()
			want := map[string]bool{}
			tx, err := conn.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for seq := range 4 {
				agg := "agg-0"
				if !shared {
					agg = fmt.Sprintf("agg-%d", seq%2)
				}
				want[insertSeqInto(t, tx, tables[seq%2], agg, seq)] = true
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			c := kafka.NewConsumer(t, kafka.AllTopics())
			if !shared {
				e.start(t)
				expectFirstArrivalsInOrder(t, c, want, want)
				return
			}
			err = waitFatal(t, e.launch(t, ioDiscard{}))
			if !errors.As(err, new(*errtext.Fatal)) || !strings.Contains(err.Error(), `aggregate "order/agg-0"`) || !strings.Contains(err.Error(), "public.outbox and public.outbox2") || !strings.Contains(err.Error(), "backfill.on_unknown_order: send") {
				t.Fatalf("got %v; want a stop naming agg-0, the two tables and backfill.on_unknown_order", err)
			}
			c.Settle(t)
			if got := ids(c.Records); len(got) > 0 {
				t.Fatalf("before the stop %d of agg-0's events were sent: %v", len(got), got)
			}
			e.cfg.Backfill.OnUnknownOrder = config.OnUnknownOrderSend
			e.start(t)
			waitForIDs(t, c, want)
		})
	}
}

// TestOrderByTableBesideAnother (rule 32): a table read in
// backfill.order_by has no order that compares with another table's rows,
// and the first start sent it alone, before or after the others: an
// aggregate with events in both got them table by table. It stops now,
// naming the table; removing its order_by, the remedy the error names,
// merges its rows with the other's in the order of the commits.
func TestOrderByTableBesideAnother(t *testing.T) {
	e, kafka, tables := crossingEnv(t, 2, func(int) int { return 10 })
	e.cfg.Tables[1].Backfill.OrderBy = []string{"id"}
	conn := testenv.Connect(t, e.db)
	want := map[string]bool{}
	for seq := range 6 {
		want[insertSeqInto(t, conn, tables[seq%2], "agg-0", seq)] = true
	}
	err := waitFatal(t, e.launch(t, ioDiscard{}))
	if !errors.As(err, new(*errtext.Fatal)) || !strings.Contains(err.Error(), "public.outbox2 in the order of id") || !strings.Contains(err.Error(), "remove its tables[].backfill.order_by") {
		t.Fatalf("got %v; want a stop naming public.outbox2's order_by", err)
	}
	e.cfg.Tables[1].Backfill.OrderBy = nil
	e.start(t)
	expectFirstArrivalsInOrder(t, kafka.NewConsumer(t, kafka.AllTopics()), want, want)
}

// TestBackfillOfCommitsAcrossTables (rule 32) draws the class: 2 or 3
// outbox tables, small chunks (so that transactions straddle them),
// transactions of 1 to 6 rows in random tables, with aggregates shared by
// the tables or each table's own. Where no transaction wrote one
// aggregate into two tables, the first start sends every event, each
// aggregate's in commit order, whatever the transactions across tables
// and the chunks' bounds. Where one did, it stops, naming an aggregate of
// the first such transaction, after sending only events in order; with
// backfill.on_unknown_order: send, every event arrives, and the
// aggregates no such transaction wrote in commit order. CDC_ORDER_SEED
// replays a seed.
func TestBackfillOfCommitsAcrossTables(t *testing.T) {
	for _, shared := range []bool{false, true} {
		t.Run(fmt.Sprintf("shared=%v", shared), func(t *testing.T) {
			seed := orderSeed(t)
			rng := rand.New(rand.NewPCG(seed, 13))
			e, kafka, tables := crossingEnv(t, 2+rng.IntN(2), func(int) int { return 4 + rng.IntN(7) })
			conn := testenv.Connect(t, e.db)
			ctx := context.Background()
			want, next := map[string]bool{}, map[string]int{}
			var first []string           // the aggregates the first transaction wrote into two tables
			crossed := map[string]bool{} // every such aggregate
			for range 20 + rng.IntN(20) {
				tx, err := conn.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				in, perTable := map[string]map[int]bool{}, map[int]int{}
				for range 1 + rng.IntN(6) {
					ti := rng.IntN(len(tables))
					for perTable[ti] >= 3 { // a transaction's rows in a table stay below a chunk
						ti = (ti + 1) % len(tables)
					}
					perTable[ti]++
					agg := fmt.Sprintf("agg-%d-%d", ti, rng.IntN(2))
					if shared {
						agg = fmt.Sprintf("agg-%d", rng.IntN(4))
					}
					want[insertSeqInto(t, tx, tables[ti], agg, next[agg])] = true
					next[agg]++
					if in[agg] == nil {
						in[agg] = map[int]bool{}
					}
					in[agg][ti] = true
				}
				if err := tx.Commit(ctx); err != nil {
					t.Fatal(err)
				}
				var both []string
				for agg, ts := range in {
					if len(ts) > 1 {
						both, crossed[agg] = append(both, "order/"+agg), true
					}
				}
				if first == nil && both != nil {
					first = both
				}
			}
			c := kafka.NewConsumer(t, kafka.AllTopics())
			if first == nil {
				e.start(t)
				expectFirstArrivalsInOrder(t, c, want, want)
				return
			}
			err := waitFatal(t, e.launch(t, ioDiscard{}))
			named := slices.ContainsFunc(first, func(a string) bool { return strings.Contains(err.Error(), fmt.Sprintf("aggregate %q", a)) })
			if !errors.As(err, new(*errtext.Fatal)) || !named {
				t.Fatalf("got %v; want a stop naming one of %v", err, first)
			}
			c.Settle(t)
			arrivedInOrder(t, c, nil)
			e.cfg.Backfill.OnUnknownOrder = config.OnUnknownOrderSend
			e.start(t)
			waitForIDs(t, c, want)
			arrivedInOrder(t, c, crossed)
			t.Logf("stopped on %v; %d aggregates written into two tables by one transaction", first, len(crossed))
		})
	}
}

// arrivedInOrder fails when an aggregate not in but arrived first after a newer
// event of its own, on c's records so far.
func arrivedInOrder(t *testing.T, c *testenv.Consumer, but map[string]bool) {
	t.Helper()
	seen, last := map[string]bool{}, map[string]int{}
	for _, rec := range c.Records {
		id := testenv.Header(rec, route.HeaderID)
		if seen[id] {
			continue
		}
		seen[id] = true
		var ev seqEvent
		if err := json.Unmarshal(rec.Value, &ev); err != nil {
			t.Fatalf("record %s: %v", id, err)
		}
		if prev, ok := last[ev.Agg]; ok && ev.Seq <= prev && !but[ev.Agg] {
			t.Errorf("%s: seq %d arrived first after seq %d", ev.Agg, ev.Seq, prev)
		}
		last[ev.Agg] = max(last[ev.Agg], ev.Seq)
	}
}

// TestUnknownOrderSendOrderByTablesFirst pins what docs/config.md says
// backfill.on_unknown_order: send does (found by the attack on issue 53,
// when the docs said "as the tables are listed"): the tables read in
// order_by go first, each whole, then the others merged by commit. With
// outbox listed first (commit order) and outbox2 second (order_by),
// agg-0's event 1 in outbox2 arrives before its event 0 in outbox.
func TestUnknownOrderSendOrderByTablesFirst(t *testing.T) {
	e, kafka, tables := crossingEnv(t, 2, func(int) int { return 10 })
	e.cfg.Tables[1].Backfill.OrderBy = []string{"id"}
	e.cfg.Backfill.OnUnknownOrder = config.OnUnknownOrderSend
	conn := testenv.Connect(t, e.db)
	first := insertSeqInto(t, conn, tables[0], "agg-0", 0)
	second := insertSeqInto(t, conn, tables[1], "agg-0", 1)
	c := kafka.NewConsumer(t, kafka.AllTopics())
	e.start(t)
	waitForIDs(t, c, map[string]bool{first: true, second: true})
	var got []string
	for _, rec := range c.Records {
		got = append(got, testenv.Header(rec, route.HeaderID))
	}
	if len(got) != 2 || got[0] != second || got[1] != first {
		t.Errorf("with on_unknown_order: send, got %v; want %s (outbox2, read in order_by) then %s (outbox)", got, second, first)
	}
}
