package pipeline_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/config"
	"github.com/outboxcdc/cdc/internal/ops"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/park"
	"github.com/outboxcdc/cdc/internal/replay"
	"github.com/outboxcdc/cdc/internal/route"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// A parked event comes back as it went in (found by the attack on the
// detours): its payload, whatever its source, NULL included; and a
// replay's records pass the same gate as the stream's.

// TestRedriveOfAParkedMessageEventSendsItsPayload: a logical decoding
// message source (pg_logical_emit_message) with on_invalid: park parks a
// key on its first event, too large. A parked record's value is the dead
// letter's, for a message its whole content, so the event form keeps the
// payload itself (park.EncodeEvent's payloadKept): the redrive sends the
// payload, seqs 1, 2, 3 in order. It sent the whole message as the first
// event's value (found by the attack on the detours).
func TestRedriveOfAParkedMessageEventSendsItsPayload(t *testing.T) {
	e := newEnv(t, testenv.NewKafka(t))
	e.cfg.Delivery = config.DeliveryAtLeastOnce
	e.cfg.Kafka.MaxMessageBytes = 4096
	topic, parked := e.kafka.Prefix+"msgs", e.kafka.Prefix+"outbox.parked"
	e.cfg.Tables = append(e.cfg.Tables, &outbox.Source{MessagePrefix: "outbox", Columns: outbox.DefaultMessageFields,
		Topic: topic, OnInvalid: outbox.OnInvalidPark, ParkedTopic: parked, DeadLetterTopic: e.kafka.Prefix + "outbox.dead-letter"})
	r := e.start(t)
	conn := testenv.Connect(t, e.db)
	c := e.kafka.NewConsumer(t, e.kafka.AllTopics())
	emit := func(seq int, pad bool) {
		payload := fmt.Sprintf(`{"seq": %d}`, seq)
		if pad {
			payload = fmt.Sprintf(`{"seq": %d, "pad": %q}`, seq, strings.Repeat("x", 5000))
		}
		msg := fmt.Sprintf(`{"id": "m-%d", "aggregate_type": "order", "aggregate_id": "K", "event_type": "E", "payload": %s}`, seq, payload)
		if _, err := conn.Exec(context.Background(), `SELECT pg_logical_emit_message(true, 'outbox', $1::text)`, msg); err != nil {
			t.Fatal(err)
		}
	}
	emit(1, true)
	emit(2, false)
	emit(3, false)
	c.WaitFor(t, time.Minute, "K's 3 events parked", func(recs []*kgo.Record) bool { return len(inTopic(recs, parked)) >= 3 })
	testenv.Eventually(t, 30*time.Second, "the checkpoint to list K parked with 3 events", func() bool {
		rec, _ := loadCheckpoint(t, e)
		return len(rec.Parked) == 1 && rec.Parked[0].Events >= 3
	})
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	e.cfg.Kafka.MaxMessageBytes = 1 << 20 // the cause fixed
	r = e.start(t)
	p := e.newPipeline(t)
	redriveAll(t, p, park.Selector{Key: "K"}, false)
	c.WaitFor(t, time.Minute, "K's 3 events on their topic", func(recs []*kgo.Record) bool { return len(inTopic(recs, topic)) >= 3 })
	c.SettleConfirmed(t, time.Minute, e.db, "outbox_cdc")
	got := seqs(t, c.Records, topic)["K"]
	if !slices.Equal(got, []int{1, 2, 3}) {
		var first string
		if on := inTopic(c.Records, topic); len(on) > 0 {
			first = string(on[0].Value)
			if len(first) > 120 {
				first = first[:120] + "..."
			}
		}
		t.Fatalf("K's events on %s after the redrive: seqs %v, want [1 2 3]; the first's value is %q (the message's whole content, not its payload)", topic, got, first)
	}
	_ = r
}

// TestRedriveOfAParkedEventWithANullPayload: an envelope table parks a key
// on an event whose payload is NULL (its topic is no legal name). A
// record's value is never NULL, so the event form keeps the payload's
// NULL: with the cause fixed, the redrive sends both events, the first
// with "payload":null. It restored an empty payload, `"payload":}`, and the
// key stayed parked for good as "invalid still" (found by the attack).
func TestRedriveOfAParkedEventWithANullPayload(t *testing.T) {
	e := newEnv(t, testenv.NewKafka(t))
	e.cfg.Delivery = config.DeliveryAtLeastOnce
	topic, parked := e.kafka.Prefix+"orders", e.kafka.Prefix+"outbox.parked"
	tbl := e.cfg.Tables[0]
	tbl.Topic, tbl.Format = e.kafka.Prefix+"{aggregate_type}", outbox.FormatEnvelope
	tbl.OnInvalid, tbl.ParkedTopic, tbl.DeadLetterTopic = outbox.OnInvalidPark, parked, e.kafka.Prefix+"outbox.dead-letter"
	r := e.start(t)
	conn := testenv.Connect(t, e.db)
	c := e.kafka.NewConsumer(t, e.kafka.AllTopics())
	insertEventTx(t, conn, "bad/type", "K", "E", `NULL`)       // no legal topic: parks K
	insertEventTx(t, conn, "orders", "K", "E", `'{"seq": 2}'`) // behind it
	c.WaitFor(t, time.Minute, "K's 2 events parked", func(recs []*kgo.Record) bool { return len(inTopic(recs, parked)) >= 2 })
	testenv.Eventually(t, 30*time.Second, "the checkpoint to list K parked with 2 events", func() bool {
		rec, _ := loadCheckpoint(t, e)
		return len(rec.Parked) == 1 && rec.Parked[0].Events >= 2
	})
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	tbl.Topic = topic // the cause fixed: every event to one topic
	e.start(t)
	p := e.newPipeline(t)
	rd := requestRedrive(t, p, park.Selector{Key: "K"}, false)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	done, err := p.Ops().WatchRedrive(ctx, rd)
	if err != nil {
		t.Fatal(err)
	}
	if !allDone(done) {
		t.Fatalf("redrive of a key parked on a NULL-payload event, its cause fixed: %s; want both events sent on, the first with \"payload\":null", done[0].Outcome)
	}
}

// TestReplayedRowReachesNoDeadLetterTopic: a row routed by its aggregate
// type into the dead-letter topic is dead-lettered live, and in a cdc
// replay too: the gate compares a replay's topics, every one with the
// replay's suffix, with the internal topics with that suffix. The row was
// a plain event record in the replay's dead-letter topic (found by the
// attack).
func TestReplayedRowReachesNoDeadLetterTopic(t *testing.T) {
	e := newEnv(t, testenv.NewKafka(t))
	e.cfg.Replay.Window = time.Hour
	dlq := e.kafka.Prefix + "outbox.dead-letter"
	tbl := e.cfg.Tables[0]
	tbl.Topic = e.kafka.Prefix + "{aggregate_type}"
	tbl.OnInvalid, tbl.DeadLetterTopic = outbox.OnInvalidDeadLetter, dlq
	e.start(t)
	conn := testenv.Connect(t, e.db)
	c := e.kafka.NewConsumer(t, e.kafka.AllTopics())
	first, _ := insertEventTx(t, conn, "order", "k-1", "E", `'{"k": 1}'`)
	bad, _ := insertEventTx(t, conn, "outbox.dead-letter", "k-2", "E", `'{"k": 2}'`)
	last, _ := insertEventTx(t, conn, "order", "k-3", "E", `'{"k": 3}'`)
	c.WaitFor(t, time.Minute, "the three events (one dead-lettered)", func(recs []*kgo.Record) bool {
		got := ids(recs)
		return got[first] > 0 && got[last] > 0 && len(inTopic(recs, dlq)) == 1
	})
	if dl := inTopic(c.Records, dlq); testenv.Header(dl[0], route.HeaderDeadLetterError) == "" {
		t.Fatalf("live: the row routed to the dead-letter topic is not a dead letter there: %v", dl[0].Headers)
	}
	from := commitOf(c.Records, first)
	if _, err := e.newPipeline(t).Replay(context.Background(), replay.Request{Range: replay.Range{FromLSN: from}, TopicSuffix: ".replay"}, nil); err != nil {
		t.Fatal(err)
	}
	rc := e.kafka.NewConsumer(t, e.kafka.AllTopics())
	rc.WaitFor(t, time.Minute, "the replay's records", func(recs []*kgo.Record) bool {
		return len(inTopic(recs, dlq+".replay")) >= 1 && len(inTopic(recs, e.kafka.Prefix+"order.replay")) >= 2
	})
	for _, rec := range inTopic(rc.Records, dlq+".replay") {
		if testenv.Header(rec, route.HeaderDeadLetterError) == "" {
			t.Fatalf("replay: event %s (a row routed to the dead-letter topic, dead-lettered live) is a plain event record in the replay's dead-letter topic %s: headers %v",
				testenv.Header(rec, route.HeaderID), rec.Topic, rec.Headers)
		}
	}
	_ = bad
}

// TestParkedKeyWithAnUnfixableEventBehindItHasARemedy (found by the
// attack on the detours): a key parks on an event too large (1), and a
// later event of it (3) is invalid in a way nobody will fix (its topic
// expression gives a number). --drop-first is refused, naming event 3
// and --drop-invalid (cdc skip does not apply: the slot is past every
// parked event); cdc redrive --drop-invalid sends 1 and 3 to the
// dead-letter topic and 2 and 4 on, in order, and un-parks the key.
func TestParkedKeyWithAnUnfixableEventBehindItHasARemedy(t *testing.T) {
	d := newDetour(t, config.DeliveryAtLeastOnce)
	d.start(t)
	conn := testenv.Connect(t, d.db)
	c := d.consumer(t)
	first := d.emit(t, conn, "K", 1, "", true)
	d.emit(t, conn, "K", 2, "", false)
	third := d.emit(t, conn, "K", 3, `"topic": 7`, false) // nobody will fix this one
	d.emit(t, conn, "K", 4, "", false)
	d.waitParked(t, c, "K", 4, 4)
	used := d.redrive(t, park.Selector{Key: "K"}, true, false)
	if allDone(used) || !strings.Contains(used[0].Outcome, "--drop-invalid") || !strings.Contains(used[0].Outcome, third) {
		t.Fatalf("--drop-first with event 3 invalid still: %+v; want it refused, naming event 3 and --drop-invalid", used)
	}
	p := d.newPipeline(t)
	rd, err := p.Ops().Redrive(context.Background(), park.Selector{Key: "K"}, ops.RedriveOptions{DropInvalid: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if used, err = p.Ops().WatchRedrive(ctx, rd); err != nil || !allDone(used) || !strings.Contains(used[0].Outcome, "2 still invalid to the dead-letter topic") {
		t.Fatalf("--drop-invalid: %+v, %v; want K sent on, 2 events dead-lettered", used, err)
	}
	c.WaitFor(t, time.Minute, "K's 2 and 4 on its topic", func(recs []*kgo.Record) bool { return len(seqs(t, recs, d.topic)["K"]) >= 2 })
	c.Settle(t)
	if got := seqs(t, c.Records, d.topic)["K"]; !slices.Equal(got, []int{2, 4}) {
		t.Errorf("K on its topic: %v; want [2 4]", got)
	}
	dead := map[string]bool{}
	for _, rec := range inTopic(c.Records, d.cfg.Tables[0].DeadLetterTopic) {
		dead[testenv.Header(rec, route.HeaderDeadLetterID)] = true
	}
	if !dead[first] || !dead[third] || len(dead) != 2 {
		t.Errorf("dead letters %v; want events 1 and 3", dead)
	}
}
