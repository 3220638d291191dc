package pipeline_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/outboxcdc/cdc/internal/checkpoint"
	"github.com/outboxcdc/cdc/internal/config"
	"github.com/outboxcdc/cdc/internal/ops"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/park"
	"github.com/outboxcdc/cdc/internal/pipeline"
	"github.com/outboxcdc/cdc/internal/relay"
	"github.com/outboxcdc/cdc/internal/route"
	"github.com/outboxcdc/cdc/internal/testenv"
	"github.com/outboxcdc/cdc/internal/testenv/testregistry"
)

// Parked keys (issue 48; docs/operations.md, "Parked keys"): one poison
// event holds back its own aggregate, not the pipeline and not its order.

// parkEnv is an env whose table parks, with a record limit a large
// payload passes.
func parkEnv(t *testing.T, mode string) *env {
	e := newEnv(t, testenv.NewKafka(t))
	e.cfg.Delivery = mode
	e.cfg.Kafka.MaxMessageBytes = 4096
	e.cfg.Tables[0].OnInvalid = outbox.OnInvalidPark
	e.cfg.Tables[0].ParkedTopic = e.kafka.Prefix + "outbox.parked"
	return e
}

// writeAggregates commits events for aggs aggregates, n each, interleaved,
// one a transaction, each with its sequence number in the payload; the
// event of seq poisonSeq of aggregate poison gets a payload over 4 KB.
func writeAggregates(t *testing.T, db string, aggs, from, n int, poison string, poisonSeq int) {
	t.Helper()
	conn := testenv.Connect(t, db)
	ctx := context.Background()
	batch := &pgx.Batch{}
	for s := from; s < from+n; s++ {
		for a := 0; a < aggs; a++ {
			agg := fmt.Sprintf("agg-%02d", a)
			pad := ""
			if agg == poison && s == poisonSeq {
				pad = strings.Repeat("x", 5000)
			}
			batch.Queue(`INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('order', $1, 'E', jsonb_build_object('seq', $2::int, 'pad', $3::text))`, agg, s, pad)
		}
	}
	if err := conn.SendBatch(ctx, batch).Close(); err != nil {
		t.Fatal(err)
	}
}

// seqs is, by aggregate, the sequence numbers of the records of topic,
// in the order they came.
func seqs(t *testing.T, recs []*kgo.Record, topic string) map[string][]int {
	t.Helper()
	out := map[string][]int{}
	for _, r := range recs {
		if r.Topic != topic {
			continue
		}
		var v struct{ Seq int }
		if err := json.Unmarshal(r.Value, &v); err != nil {
			t.Fatalf("record %s/%d: %v", r.Topic, r.Offset, err)
		}
		out[string(r.Key)] = append(out[string(r.Key)], v.Seq)
	}
	return out
}

// requestRedrive asks p's pipeline for a redrive of what sel selects.
func requestRedrive(t *testing.T, p *pipeline.Pipeline, sel park.Selector, dropFirst bool) ops.Redriving {
	t.Helper()
	rd, err := p.Ops().RequestRedrive(context.Background(), sel, dropFirst, false)
	if err != nil {
		t.Fatalf("redrive %s: %v", sel, err)
	}
	return rd
}

// waitRedrive waits until the pipeline took every request of rd, and
// fails unless each sent every parking it named on.
func waitRedrive(t *testing.T, p *pipeline.Pipeline, rd ops.Redriving) []checkpoint.Used {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	done, err := p.Ops().WatchRedrive(ctx, rd)
	if err != nil {
		t.Fatalf("redrive: %v (%d of %d requests taken)", err, len(done), len(rd.Requests))
	}
	for _, u := range done {
		if !u.Done {
			t.Fatalf("redrive %s: %s", u.ID, u.Outcome)
		}
	}
	return done
}

// redriveAll asks for a redrive of sel and waits until every key it
// selects was sent on.
func redriveAll(t *testing.T, p *pipeline.Pipeline, sel park.Selector, dropFirst bool) {
	t.Helper()
	waitRedrive(t, p, requestRedrive(t, p, sel, dropFirst))
}

// inOrder reports whether got is from to from+n-1, each once, in order.
func inOrder(got []int, from, n int) bool {
	if len(got) != n {
		return false
	}
	for i, s := range got {
		if s != from+i {
			return false
		}
	}
	return true
}

// TestParkedKeyHoldsBackItsAggregate: 20 aggregates x 200 events, one
// event of agg-07 over max_message_bytes in the middle. The 19 others
// arrive complete and in order while agg-07 is parked: its events from
// the poison on are in the parked topic, in order, not on its topic. A
// restart, and a takeover by a second replica, keep it parked. Once the
// cause is fixed (the limit raised), cdc redrive --key agg-07 sends its
// events on: every aggregate reads in commit order on the topic, with no
// gap, and (read_committed) none twice in exactly-once mode.
func TestParkedKeyHoldsBackItsAggregate(t *testing.T) {
	for _, mode := range []string{config.DeliveryAtLeastOnce, config.DeliveryExactlyOnce} {
		t.Run(mode, func(t *testing.T) {
			e := parkEnv(t, mode)
			topic, parked := e.kafka.Prefix+"outbox.event.order", e.cfg.Tables[0].ParkedTopic
			r := e.start(t)
			c := e.kafka.NewConsumer(t, e.kafka.AllTopics())
			if mode == config.DeliveryExactlyOnce {
				c = e.kafka.NewCommittedConsumer(t, e.kafka.AllTopics())
			}
			writeAggregates(t, e.db, 20, 1, 200, "agg-07", 100)
			c.WaitFor(t, 2*time.Minute, "19 aggregates complete, and agg-07's parked", func(recs []*kgo.Record) bool {
				on, held := seqs(t, recs, topic), seqs(t, recs, parked)
				for a := 0; a < 20; a++ {
					if a != 7 && len(on[fmt.Sprintf("agg-%02d", a)]) < 200 {
						return false
					}
				}
				return len(on["agg-07"]) >= 99 && len(held["agg-07"]) >= 101
			})
			c.SettleConfirmed(t, time.Minute, e.db, "outbox_cdc")
			on, held := seqs(t, c.Records, topic), seqs(t, c.Records, parked)
			for a := 0; a < 20; a++ {
				agg := fmt.Sprintf("agg-%02d", a)
				if a != 7 && !inOrder(on[agg], 1, 200) {
					t.Fatalf("%s on its topic: %v; want 1 to 200 in order", agg, on[agg])
				}
			}
			if !inOrder(on["agg-07"], 1, 99) || !inOrder(held["agg-07"], 100, 101) {
				t.Fatalf("agg-07: %d on its topic, %d parked; want 1-99 on it, 100-200 parked, in order", len(on["agg-07"]), len(held["agg-07"]))
			}
			first := c.Records[0]
			for _, rec := range c.Records {
				if rec.Topic == parked && testenv.Header(rec, route.HeaderDeadLetterError) != "" {
					first = rec
				}
			}
			if !strings.Contains(testenv.Header(first, route.HeaderDeadLetterError), "max_message_bytes") || testenv.Header(first, route.HeaderDeadLetterTopic) != topic {
				t.Fatalf("the first parked event's headers: %v", first.Headers)
			}
			reg := r.p.Metrics().Registry
			if testenv.Value(t, reg, "cdc_parked_keys") != 1 || testenv.Counter(t, reg, "cdc_parked_events_total", "table", "public.outbox") != 101 {
				t.Fatalf("cdc_parked_keys %v, cdc_parked_events_total %v; want 1 and 101", testenv.Value(t, reg, "cdc_parked_keys"),
					testenv.Counter(t, reg, "cdc_parked_events_total", "table", "public.outbox"))
			}

			// A restart, then a takeover: agg-07's new events still park.
			if err := r.stop(t); err != nil {
				t.Fatal(err)
			}
			r = e.start(t)
			writeAggregates(t, e.db, 20, 201, 5, "", 0)
			standby := e.launch(t, discard{})
			waitDetail(t, standby, "standby")
			if err := r.stop(t); err != nil {
				t.Fatal(err)
			}
			testenv.Eventually(t, time.Minute, "the standby to take over", func() bool { return standby.tracker.Load() != nil })
			writeAggregates(t, e.db, 20, 206, 5, "", 0)
			c.WaitFor(t, time.Minute, "the 10 new events of each aggregate", func(recs []*kgo.Record) bool {
				return len(seqs(t, recs, topic)["agg-00"]) >= 210 && len(seqs(t, recs, parked)["agg-07"]) >= 111
			})

			// The cause fixed, a redrive sends agg-07's events on.
			if err := standby.stop(t); err != nil {
				t.Fatal(err)
			}
			e.cfg.Kafka.MaxMessageBytes = 1 << 20
			r = e.start(t)
			p, err := pipeline.New(e.cfg, hclog.NewNullLogger(), pipeline.Options{})
			if err != nil {
				t.Fatal(err)
			}
			rd := requestRedrive(t, p, park.Selector{Key: "agg-07"}, false)
			writeAggregates(t, e.db, 20, 211, 5, "", 0) // after the request: behind the redriven events
			waitRedrive(t, p, rd)
			c.WaitFor(t, 2*time.Minute, "every aggregate's 215 events on the topic", func(recs []*kgo.Record) bool {
				on := seqs(t, recs, topic)
				for a := 0; a < 20; a++ {
					if len(on[fmt.Sprintf("agg-%02d", a)]) < 215 {
						return false
					}
				}
				return true
			})
			c.SettleConfirmed(t, time.Minute, e.db, "outbox_cdc")
			on = seqs(t, c.Records, topic)
			for a := 0; a < 20; a++ {
				agg := fmt.Sprintf("agg-%02d", a)
				if !inOrder(on[agg], 1, 215) {
					t.Errorf("%s on its topic after the redrive: %d events, in order %v; want 1 to 215 in order, each once", agg, len(on[agg]), inOrder(on[agg], 1, len(on[agg])))
				}
			}
			if n := testenv.Value(t, r.p.Metrics().Registry, "cdc_parked_keys"); n != 0 {
				t.Errorf("cdc_parked_keys %v after the redrive, want 0", n)
			}
		})
	}
}

// TestParkedKeysBounded: max_parked_keys keys park; one more stops the
// connector with the error on_invalid: fail gives, saying what to do, and
// nothing is dropped: the slot still holds it.
func TestParkedKeysBounded(t *testing.T) {
	e := parkEnv(t, config.DeliveryAtLeastOnce)
	e.cfg.MaxParkedKeys = 2
	r := e.start(t)
	for _, agg := range []string{"agg-00", "agg-01", "agg-02"} {
		writeAggregates(t, e.db, 3, 1, 1, agg, 1)
	}
	err := waitFatal(t, r)
	var full *relay.FullError
	if !errors.As(err, &full) || !strings.Contains(err.Error(), "max_parked_keys (2)") || !errors.As(err, new(*outbox.EventError)) {
		t.Fatalf("got %v; want the error on_invalid: fail gives, naming max_parked_keys", err)
	}
}

// TestUnkeyedInvalidEvent: an invalid event without a key cannot park: it
// stops the connector, or, with on_invalid_unkeyed: dead-letter, goes to
// the dead-letter topic while its table streams on.
func TestUnkeyedInvalidEvent(t *testing.T) {
	for _, unkeyed := range []string{outbox.OnInvalidFail, outbox.OnInvalidDeadLetter} {
		t.Run(unkeyed, func(t *testing.T) {
			e := parkEnv(t, config.DeliveryAtLeastOnce)
			e.cfg.Tables[0].OnInvalidUnkeyed = unkeyed
			e.cfg.Tables[0].DeadLetterTopic = e.kafka.Prefix + "outbox.dead-letter"
			testenv.Exec(t, e.db, `ALTER TABLE outbox ALTER COLUMN aggregateid DROP NOT NULL`)
			r := e.start(t)
			testenv.Exec(t, e.db, `INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('order', NULL, 'E', jsonb_build_object('pad', repeat('x', 5000)))`)
			if unkeyed == outbox.OnInvalidFail {
				if err := waitFatal(t, r); !errors.As(err, new(*outbox.EventError)) {
					t.Fatalf("got %v; want the event's error", err)
				}
				return
			}
			good := insertEvent(t, testenv.Connect(t, e.db), "after", "E")
			c := e.kafka.NewConsumer(t, e.kafka.AllTopics())
			c.WaitFor(t, time.Minute, "the dead letter and the next event", func(recs []*kgo.Record) bool {
				dl := false
				for _, rec := range recs {
					dl = dl || rec.Topic == e.cfg.Tables[0].DeadLetterTopic
				}
				return dl && ids(recs)[good] > 0
			})
		})
	}
}

// TestParkedKeyOnSchema: the same with a payload its JSON Schema refuses
// (a pad longer than the schema allows, in one event of agg-03): the
// other aggregates stream on, agg-03 parks; once a schema that allows it
// is registered, a redrive sends agg-03's events on, each checked and
// encoded against it, in order, with no gap.
func TestParkedKeyOnSchema(t *testing.T) {
	e, reg := schemaEnv(t, outbox.SchemaJSONSchema, "")
	tb := e.cfg.Tables[0]
	tb.OnInvalid, tb.DeadLetterTopic, tb.ParkedTopic = outbox.OnInvalidPark, "", e.kafka.Prefix+"outbox.parked"
	topic := e.kafka.Prefix + "outbox.event.order"
	strict := `{"type":"object","required":["seq"],"properties":{"seq":{"type":"integer"},"pad":{"type":"string","maxLength":100}}}`
	if _, _, err := reg.RegisterSchema(topic+"-value", sr.Schema{Schema: strict, Type: sr.TypeJSON}); err != nil {
		t.Fatal(err)
	}
	e.start(t)
	c := e.kafka.NewConsumer(t, e.kafka.AllTopics())
	writeAggregates(t, e.db, 5, 1, 40, "agg-03", 20)
	c.WaitFor(t, time.Minute, "4 aggregates complete, agg-03 parked from its 20th", func(recs []*kgo.Record) bool {
		on := seqsOf(t, reg, recs, topic)
		return len(on["agg-00"]) >= 40 && len(on["agg-04"]) >= 40 && len(byKey(inTopic(recs, tb.ParkedTopic), "agg-03")) >= 21
	})
	c.SettleConfirmed(t, time.Minute, e.db, "outbox_cdc")
	if on := seqsOf(t, reg, c.Records, topic); !inOrder(on["agg-03"], 1, 19) || !inOrder(on["agg-01"], 1, 40) {
		t.Fatalf("agg-03 on its topic: %v, agg-01: %d; want agg-03 1-19, agg-01 1-40", on["agg-03"], len(on["agg-01"]))
	}
	loose := `{"type":"object","required":["seq"],"properties":{"seq":{"type":"integer"},"pad":{"type":"string"}}}`
	if _, _, err := reg.RegisterSchema(topic+"-value", sr.Schema{Schema: loose, Type: sr.TypeJSON}); err != nil {
		t.Fatal(err)
	}
	p, err := pipeline.New(e.cfg, hclog.NewNullLogger(), pipeline.Options{})
	if err != nil {
		t.Fatal(err)
	}
	redriveAll(t, p, park.Selector{Key: "agg-03"}, false)
	c.WaitFor(t, time.Minute, "agg-03's 40 events on its topic", func(recs []*kgo.Record) bool {
		return len(seqsOf(t, reg, recs, topic)["agg-03"]) >= 40
	})
	c.SettleConfirmed(t, time.Minute, e.db, "outbox_cdc")
	if on := seqsOf(t, reg, c.Records, topic); !inOrder(on["agg-03"], 1, 40) {
		t.Fatalf("agg-03 after the redrive: %v; want 1 to 40 in order, each once", on["agg-03"])
	}
}

// seqsOf is seqs for records encoded for the registry reg.
func seqsOf(t *testing.T, reg *testregistry.Registry, recs []*kgo.Record, topic string) map[string][]int {
	t.Helper()
	out := map[string][]int{}
	for _, r := range recs {
		if r.Topic != topic {
			continue
		}
		_, v := reg.Decode(t, r)
		var p struct{ Seq int }
		if err := json.Unmarshal([]byte(v), &p); err != nil {
			t.Fatalf("record %s/%d: %v", r.Topic, r.Offset, err)
		}
		out[string(r.Key)] = append(out[string(r.Key)], p.Seq)
	}
	return out
}

// inTopic is the records of topic.
func inTopic(recs []*kgo.Record, topic string) []*kgo.Record {
	var out []*kgo.Record
	for _, r := range recs {
		if r.Topic == topic {
			out = append(out, r)
		}
	}
	return out
}
