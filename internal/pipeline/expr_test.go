package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/config"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/park"
	"github.com/outboxcdc/cdc/internal/pipeline"
	"github.com/outboxcdc/cdc/internal/replay"
	"github.com/outboxcdc/cdc/internal/route"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// Expressions (issue 49; docs/config.md, "Expressions"): a table's filter
// and expressions decide each event from its row and payload.

// seed000Schema is seed 000's events table, with the shard its team pins
// partitions by.
const seed000Schema = `CREATE TABLE events (
  event_id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
  type text NOT NULL,
  organization_id text,
  actor_type text NOT NULL,
  shard int NOT NULL,
  payload jsonb NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now())`

// seed000Table routes seed 000's events by expressions: test tenants left
// out, the topic by the payload's region, the key its customer, the
// partition the row's shard, and a header of two columns.
func seed000Table(prefix string) *outbox.Source {
	return &outbox.Source{
		Name:    outbox.TableName{Schema: "public", Name: "events"},
		Columns: outbox.Columns{outbox.FieldID: "event_id", outbox.FieldEventType: "type", outbox.FieldTenant: "organization_id", outbox.FieldPayload: "payload"},
		Filter:  `tenant != "test"`,
		Expressions: outbox.Expressions{
			Topic:     `"` + prefix + `practice." + payload.region.lowerAscii()`,
			Key:       `payload.customerId`,
			Partition: `row.shard`,
			Headers:   map[string]string{"x-actor": `row.actor_type + "/" + string(row.shard)`},
		},
	}
}

// seedEvent is one row of the events table, as written and as its record
// must be.
type seedEvent struct {
	id, tenant, customer, region, payload string
	shard, n                              int
}

// writeSeed000 inserts evs in one transaction.
func writeSeed000(t *testing.T, conn *pgx.Conn, evs ...*seedEvent) {
	t.Helper()
	ctx := context.Background()
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		for _, ev := range evs {
			// jsonb's canonical text (keys by length, then bytes), so
			// that the bytes read back are the ones written.
			ev.payload = fmt.Sprintf(`{"n": %d, "region": "%s", "customerId": "%s"}`, ev.n, ev.region, ev.customer)
			var tenant any = ev.tenant
			if ev.tenant == "" {
				tenant = nil
			}
			if err := tx.QueryRow(ctx, `INSERT INTO events (type, organization_id, actor_type, shard, payload) VALUES ('practice.created', $1, 'user', $2, $3) RETURNING event_id::text`,
				tenant, ev.shard, ev.payload).Scan(&ev.id); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestExpressionsEndToEnd: a filter that leaves out half the events (the
// test tenant's) and expressions for the topic, key, partition and a
// header, over the first start's backfill, the stream and a replay, in
// both delivery modes. Every other event arrives once with the topic, key,
// partition, headers and bytes its expressions give, in per-key order; no
// test tenant's event is in Kafka, though each shares its partition with a
// later event that is; the filtered events are counted; the slot passes
// them, transactions of only filtered events too, and retention deletes
// their rows with the others.
func TestExpressionsEndToEnd(t *testing.T) {
	for _, mode := range []string{config.DeliveryAtLeastOnce, config.DeliveryExactlyOnce} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			k := testenv.NewKafka(t)
			e := newEnv(t, k)
			testenv.Exec(t, e.db, seed000Schema)
			e.cfg.Delivery = mode
			e.cfg.Postgres.Slot = map[string]string{config.DeliveryAtLeastOnce: "expr_alo", config.DeliveryExactlyOnce: "expr_eos"}[mode]
			e.cfg.Kafka.TopicDefaults.Partitions = 4
			tbl := seed000Table(k.Prefix)
			tbl.Backfill = &outbox.BackfillOptions{}
			tbl.Retention = &outbox.Retention{After: time.Second}
			e.cfg.Tables = []*outbox.Source{tbl}
			e.retentionInterval = 200 * time.Millisecond
			if mode == config.DeliveryAtLeastOnce {
				e.cfg.Replay.Window = time.Hour
			}
			conn := testenv.Connect(t, e.db)

			// Each customer's events share a region (its topic) and a
			// shard (its partition); a test tenant's event comes before
			// one of the same customer's that is not.
			n := 0
			event := func(tenant string, customer int) *seedEvent {
				n++
				return &seedEvent{tenant: tenant, customer: fmt.Sprintf("c-%d", customer), region: []string{"EU", "Us"}[customer%2], shard: customer, n: n}
			}
			var all []*seedEvent
			write := func(evs ...*seedEvent) {
				writeSeed000(t, conn, evs...)
				all = append(all, evs...)
			}
			for c := 0; c < 4; c++ { // the first start's backfill reads these
				write(event("test", c), event("org-1", c))
			}
			r := e.start(t)
			firstLive := len(all)
			for i := 0; i < 16; i++ {
				c := i % 4
				if i%4 == 0 {
					write(event("test", c), event("test", (c+1)%4)) // nothing of it is sent
				}
				tenant := "org-2"
				if i == 7 {
					tenant = "" // NULL is not "test": sent, without a tenant header
				}
				write(event("test", c), event(tenant, c))
			}
			end := testenv.CurrentWAL(t, e.db)

			var want []*seedEvent
			filtered := 0
			for _, ev := range all {
				if ev.tenant == "test" {
					filtered++
				} else {
					want = append(want, ev)
				}
			}
			c := k.NewConsumer(t, k.AllTopics())
			if mode == config.DeliveryExactlyOnce {
				c = k.NewCommittedConsumer(t, k.AllTopics())
			}
			c.WaitFor(t, time.Minute, fmt.Sprintf("the %d events of real tenants", len(want)), func(recs []*kgo.Record) bool {
				got := ids(recs)
				for _, ev := range want {
					if got[ev.id] == 0 {
						return false
					}
				}
				return true
			})
			checkSeed000Records(t, k.Prefix, c.Records, want, all)

			if got := testenv.Counter(t, r.p.Metrics().Registry, "cdc_events_filtered_total", "table", "public.events"); got != float64(filtered) {
				t.Errorf("cdc_events_filtered_total = %v, want %d", got, filtered)
			}
			testenv.Eventually(t, 30*time.Second, "the slot to pass every transaction, those of only filtered events too", func() bool {
				return testenv.SlotPosition(t, e.db, e.cfg.Postgres.Slot) >= end
			})
			testenv.Eventually(t, time.Minute, "retention to delete every row, the filtered ones too", func() bool {
				var left int
				testenv.QueryRow(t, e.db, `SELECT count(*) FROM events`, nil, &left)
				return left == 0
			})
			if mode == config.DeliveryAtLeastOnce {
				replaySeed000(t, e, c.Records, all, firstLive)
			}
		})
	}
}

// checkSeed000Records checks each record against the row it came from,
// the order of each customer's events, and that no filtered event is
// there.
func checkSeed000Records(t *testing.T, prefix string, recs []*kgo.Record, want, all []*seedEvent) {
	t.Helper()
	byID := map[string]*seedEvent{}
	for _, ev := range all {
		byID[ev.id] = ev
	}
	last := map[string]int{}
	for _, rec := range recs {
		id := testenv.Header(rec, route.HeaderID)
		ev := byID[id]
		if ev == nil {
			t.Errorf("a record of no written event: topic %s id %q", rec.Topic, id)
			continue
		}
		if ev.tenant == "test" {
			t.Errorf("event %s of the test tenant was sent (topic %s); the filter leaves it out", id, rec.Topic)
			continue
		}
		topic := prefix + "practice." + strings.ToLower(ev.region)
		if rec.Topic != topic || string(rec.Key) != ev.customer || rec.Partition != int32(ev.shard) || string(rec.Value) != ev.payload {
			t.Errorf("event %d: topic %s key %q partition %d value %s; want %s, %q, %d, %s", ev.n, rec.Topic, rec.Key, rec.Partition, rec.Value, topic, ev.customer, ev.shard, ev.payload)
		}
		if got, want := testenv.Header(rec, "x-actor"), fmt.Sprintf("user/%d", ev.shard); got != want {
			t.Errorf("event %d: header x-actor %q, want %q", ev.n, got, want)
		}
		if testenv.Header(rec, route.HeaderTenant) != ev.tenant || testenv.Header(rec, route.HeaderEventType) != "practice.created" {
			t.Errorf("event %d: headers %v", ev.n, rec.Headers)
		}
		if ev.n <= last[ev.customer] {
			t.Errorf("customer %s: event %d after %d; per-key order broken", ev.customer, ev.n, last[ev.customer])
		}
		last[ev.customer] = ev.n
	}
	if got := ids(recs); len(got) != len(want) {
		t.Errorf("%d distinct events in Kafka, want %d", len(got), len(want))
	}
}

// replaySeed000 replays the stream's part of the window: the filter
// leaves the same events out of a replay.
func replaySeed000(t *testing.T, e *env, recs []*kgo.Record, all []*seedEvent, firstLive int) {
	t.Helper()
	// The range starts at the first live transaction with an event sent:
	// a test tenant's event, then one sent (the loop's mixed transaction),
	// so the test tenant's events in range are that one and all after.
	var live []string
	from, leftOut := pglogrepl.LSN(0), 0
	for i, ev := range all[firstLive:] {
		if ev.tenant != "test" {
			live = append(live, ev.id)
			if from == 0 {
				from = commitOf(recs, ev.id)
			}
			continue
		}
		next := all[min(firstLive+i+1, len(all)-1)]
		if from != 0 || next.tenant != "test" {
			leftOut++
		}
	}
	sum, err := e.newPipeline(t).Replay(context.Background(), replay.Request{Range: replay.Range{FromLSN: from, ToLSN: testenv.CurrentWAL(t, e.db)}, TopicSuffix: ".replay"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Events != int64(len(live)) || sum.Acked != uint64(len(live)) || sum.LeftOut != int64(leftOut) {
		t.Errorf("replay summary: %d events sent, %d acknowledged, %d left out; want %d, %d, %d", sum.Events, sum.Acked, sum.LeftOut, len(live), len(live), leftOut)
	}
	replayed(t, e, ".replay", live)
}

// failingOutbox is the default outbox routed by expressions that a row can
// make fail in every way at run time.
func failingOutbox(e *env, onInvalid string) *outbox.Source {
	t := e.cfg.Tables[0]
	t.Topic, t.Key, t.OnInvalid = "", "", onInvalid
	t.DeadLetterTopic = e.kafka.Prefix + "outbox.dead-letter"
	t.Filter = `(!has(payload.items) || payload.items.all(i, i >= 0)) && (!has(payload.tags) || size(payload.tags) < 100)`
	t.Expressions = outbox.Expressions{
		Topic:     `has(payload.topic) ? payload.topic : "` + e.kafka.Prefix + `orders." + payload.region`,
		Key:       `payload.customerId`,
		Partition: `int(payload.p)`,
	}
	e.cfg.Kafka.TopicDefaults.Partitions = 4
	return t
}

// insertPayload inserts one event with payload (SQL) and returns its id.
func insertPayload(t *testing.T, conn *pgx.Conn, payloadSQL string) string {
	t.Helper()
	var id string
	if err := conn.QueryRow(context.Background(), `INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('order', 'a', 'E', `+payloadSQL+`) RETURNING id::text`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

// TestExpressionFailuresGoThroughOnInvalid: an expression a row makes fail
// at run time (a missing member, a wrong type, an illegal topic, a
// partition the topic does not have, the checkpoint topic, a filter that
// fails, the cost limit) makes the event invalid, and on_invalid decides:
// dead-letter sends each to the dead-letter topic with why, and the stream
// goes on; park parks its key, the key's later event follows it, and a
// redrive sends that one to the partition its expression pinned. (fail:
// TestExpressionFailureStops.)
func TestExpressionFailuresGoThroughOnInvalid(t *testing.T) {
	t.Run("dead-letter", func(t *testing.T) {
		k := testenv.NewKafka(t)
		e := newEnv(t, k)
		tbl := failingOutbox(e, outbox.OnInvalidDeadLetter)
		r := e.start(t)
		conn := testenv.Connect(t, e.db)
		good := insertPayload(t, conn, `'{"p": 1, "region": "eu", "customerId": "c-1"}'`)
		bad := map[string]string{}
		for payload, why := range map[string]string{
			`'{"p": 1, "region": "eu"}'`:                                                 "its expressions.key (payload.customerId) failed: no such key: customerId",
			`'{"p": 1, "region": "eu", "customerId": 42}'`:                               "its expressions.key (payload.customerId) failed: it gave int, not a string",
			`'{"p": 1, "region": "e/u", "customerId": "c-2"}'`:                           `topic name "` + k.Prefix + `orders.e/u" contains '/'`,
			`'{"p": 7, "region": "eu", "customerId": "c-3"}'`:                            `gave 7, but topic "` + k.Prefix + `orders.eu" has 4 partitions`,
			`'{"p": 0, "topic": "` + e.cfg.Checkpoint.Topic + `", "customerId": "c-4"}'`: "its topic is the checkpoint topic",
			`'{"p": 1, "tags": 5, "region": "eu", "customerId": "c-5"}'`:                 "its filter (" + tbl.Filter + ") failed: no such overload",
			`jsonb_build_object('p', 1, 'region', 'eu', 'customerId', 'c-6', 'items', (SELECT jsonb_agg(0) FROM generate_series(1, 250000)))`: "failed: it reached the cost limit of 1000000 for one event",
		} {
			bad[insertPayload(t, conn, payload)] = why
		}
		last := insertPayload(t, conn, `'{"p": 3, "region": "eu", "customerId": "c-1"}'`)
		end := testenv.CurrentWAL(t, e.db)
		c := k.NewConsumer(t, k.AllTopics())
		c.WaitFor(t, time.Minute, "the good events and a dead letter for each bad one", func(recs []*kgo.Record) bool {
			got := ids(recs)
			n := 0
			for _, rec := range recs {
				if rec.Topic == tbl.DeadLetterTopic {
					n++
				}
			}
			return got[good] > 0 && got[last] > 0 && n >= len(bad)
		})
		for _, rec := range c.Records {
			id := testenv.Header(rec, route.HeaderID)
			switch {
			case rec.Topic == tbl.DeadLetterTopic:
				why, ok := bad[id]
				if !ok || testenv.Header(rec, route.HeaderDeadLetterID) != id || !strings.Contains(testenv.Header(rec, route.HeaderDeadLetterError), why) {
					t.Errorf("dead letter of %s: %q; want it to say %q", id, testenv.Header(rec, route.HeaderDeadLetterError), why)
				}
				delete(bad, id)
			case id == good || id == last:
				if rec.Topic != k.Prefix+"orders.eu" || string(rec.Key) != "c-1" || rec.Partition != map[string]int32{good: 1, last: 3}[id] {
					t.Errorf("event %s: topic %s key %q partition %d", id, rec.Topic, rec.Key, rec.Partition)
				}
			default:
				t.Errorf("an invalid event reached topic %s: %s", rec.Topic, id)
			}
		}
		if len(bad) != 0 {
			t.Errorf("no dead letter for %v", bad)
		}
		if n := testenv.Value(t, r.p.Metrics().Registry, "cdc_invalid_events_total"); n != 7 {
			t.Errorf("cdc_invalid_events_total = %v, want 7", n)
		}
		testenv.Eventually(t, 30*time.Second, "the slot to pass every event", func() bool { return testenv.SlotPosition(t, e.db, "outbox_cdc") >= end })
	})

	t.Run("park", func(t *testing.T) {
		k := testenv.NewKafka(t)
		e := newEnv(t, k)
		tbl := failingOutbox(e, outbox.OnInvalidPark)
		tbl.ParkedTopic = k.Prefix + "outbox.parked"
		e.start(t)
		conn := testenv.Connect(t, e.db)
		first := insertPayload(t, conn, `'{"p": 9, "region": "eu", "customerId": "c-5"}'`)
		behind := insertPayload(t, conn, `'{"p": 2, "region": "eu", "customerId": "c-5"}'`)
		other := insertPayload(t, conn, `'{"p": 1, "region": "eu", "customerId": "c-6"}'`)
		c := k.NewConsumer(t, k.AllTopics())
		c.WaitFor(t, time.Minute, "c-5's two events parked, c-6's sent", func(recs []*kgo.Record) bool {
			parked := 0
			for _, rec := range recs {
				if rec.Topic == tbl.ParkedTopic && string(rec.Key) == "c-5" {
					parked++
				}
			}
			return parked == 2 && ids(recs)[other] > 0
		})
		p, err := pipeline.New(e.cfg, hclog.NewNullLogger(), pipeline.Options{})
		if err != nil {
			t.Fatal(err)
		}
		redriveAll(t, p, park.Selector{Key: "c-5"}, true)
		c.WaitFor(t, time.Minute, "c-5's event behind the first on its topic, and the first dead-lettered", func(recs []*kgo.Record) bool {
			on, dead := false, false
			for _, rec := range recs {
				id := testenv.Header(rec, route.HeaderID)
				on = on || rec.Topic == k.Prefix+"orders.eu" && id == behind
				dead = dead || rec.Topic == tbl.DeadLetterTopic && id == first
			}
			return on && dead
		})
		for _, rec := range c.Records {
			if rec.Topic == k.Prefix+"orders.eu" && testenv.Header(rec, route.HeaderID) == behind && (rec.Partition != 2 || string(rec.Key) != "c-5") {
				t.Errorf("the redriven event: partition %d key %q; want the pinned 2, c-5", rec.Partition, rec.Key)
			}
		}
	})
}

// TestExpressionFailureStops: with on_invalid: fail, an expression a row
// makes fail stops the connector on that event, naming it and the
// expression, with the slot not past its commit record. (Apart from
// TestExpressionFailuresGoThroughOnInvalid: it reads the commit record
// with pg_walinspect, which PostgreSQL 14 does not have.)
func TestExpressionFailureStops(t *testing.T) {
	e := newEnv(t, testenv.NewKafka(t))
	failingOutbox(e, outbox.OnInvalidFail)
	r := e.start(t)
	before := testenv.CurrentWAL(t, e.db)
	id, xid := insertEventTx(t, testenv.Connect(t, e.db), "order", "a", "E", `'{"p": 1, "region": "eu"}'`)
	err := waitFatal(t, r)
	var ee *outbox.EventError
	if !errors.As(err, &ee) || ee.EventID != id || !strings.Contains(err.Error(), "its expressions.key (payload.customerId) failed: no such key: customerId") {
		t.Fatalf("got %v; want the event's error, naming the expression", err)
	}
	// The slot may pass the WAL before the commit record (a keepalive
	// while the transaction was still being written), never the commit.
	if pos, commit := testenv.SlotPosition(t, e.db, "outbox_cdc"), testenv.CommitLSN(t, e.db, xid, before); pos > commit {
		t.Fatalf("the slot confirmed %s, past the invalid event's commit record at %s", pos, commit)
	}
}
