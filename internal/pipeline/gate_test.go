package pipeline_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/outboxcdc/cdc/internal/config"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/park"
	"github.com/outboxcdc/cdc/internal/pipeline"
	"github.com/outboxcdc/cdc/internal/route"
	"github.com/outboxcdc/cdc/internal/signing"
	"github.com/outboxcdc/cdc/internal/sink"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// The gate (docs/security.md, "One gate"): a row chooses its topic, never
// what its record may reach. Each test here makes a row choose a topic it
// may not have, on a parking table: the row's key parks, the pipeline
// goes on for every other key.

// topicsOf lists the brokers' topics.
func topicsOf(t *testing.T, kafka *testenv.Kafka, opts ...kgo.Opt) kadm.TopicDetails {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(kafka.Brokers...)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	topics, err := kadm.NewClient(cl).ListTopics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return topics
}

// parkedByID is, by event id, the first parked record of each parking
// (the one with the reason) in topic.
func parkedByID(recs []*kgo.Record, topic string) map[string]*kgo.Record {
	out := map[string]*kgo.Record{}
	for _, r := range recs {
		if r.Topic == topic && testenv.Header(r, route.HeaderDeadLetterError) != "" {
			out[testenv.Header(r, route.HeaderDeadLetterID)] = r
		}
	}
	return out
}

// TestRowsReachNoInternalTopic (issue 54 items 1 and 4, and the attack on
// the gate): rows routed, through a template, to Kafka's own topic, and
// to names Kafka takes for the parked, dead-letter and checkpoint topics
// ('.' and '_' alike: made first, they keep the real ones from being
// made). Each such row parks its key, with the reason; no such topic is
// made; the next key's event and the key's own later event go where
// they belong; the pipeline never stops.
func TestRowsReachNoInternalTopic(t *testing.T) {
	kafka := testenv.NewKafka(t)
	e := newEnv(t, kafka)
	p := kafka.Prefix
	tbl := e.cfg.Tables[0]
	tbl.Topic = "{aggregate_type}"
	tbl.OnInvalid = outbox.OnInvalidPark
	tbl.ParkedTopic = p + "outbox.parked"
	tbl.DeadLetterTopic = p + "dead.letters"
	e.cfg.Checkpoint.Topic = p + "check.points"
	r := e.start(t)
	conn := testenv.Connect(t, e.db)
	orders := p + "orders"
	first, _ := insertEventTx(t, conn, orders, "a-0", "E", `'{}'`)
	bad := map[string]string{ // key → the topic its row names
		"a-1": "__consumer_offsets",
		"a-2": p + "outbox_parked",
		"a-3": p + "dead_letters",
		"a-4": p + "check_points",
		"a-5": p + "outbox.parked",
		"a-6": p + "dead.letters",
	}
	badIDs := map[string]string{}
	for _, k := range []string{"a-1", "a-2", "a-3", "a-4", "a-5", "a-6"} {
		badIDs[k], _ = insertEventTx(t, conn, bad[k], k, "E", `'{}'`)
	}
	behind, _ := insertEventTx(t, conn, orders, "a-1", "E", `'{}'`)
	after, _ := insertEventTx(t, conn, orders, "a-9", "E", `'{}'`)

	c := kafka.NewConsumer(t, kafka.AllTopics())
	c.WaitFor(t, time.Minute, "the other key's event on its topic, and six parkings", func(recs []*kgo.Record) bool {
		return ids(recs)[after] == 1 && len(parkedByID(recs, tbl.ParkedTopic)) == 6
	})
	c.SettleConfirmed(t, time.Minute, e.db, "outbox_cdc")
	held := parkedByID(c.Records, tbl.ParkedTopic)
	for k, id := range badIDs {
		rec := held[id]
		if rec == nil || string(rec.Key) != k {
			t.Errorf("the event of %s routed to %q: %v; want it parked under its key", k, bad[k], rec)
			continue
		}
		if why := testenv.Header(rec, route.HeaderDeadLetterError); !strings.Contains(why, "as Kafka compares names") && !strings.Contains(why, "internal topics") {
			t.Errorf("%s parked for %q; want the reason to name the topic it may not reach", k, why)
		}
	}
	for _, rec := range c.Records {
		switch {
		case rec.Topic == tbl.ParkedTopic:
			if string(rec.Key) == "a-1" && testenv.Header(rec, route.HeaderDeadLetterID) != badIDs["a-1"] && testenv.Header(rec, route.HeaderDeadLetterID) != behind {
				t.Errorf("a parked record of a-1 that is not its event: %v", rec.Headers)
			}
		case rec.Topic == orders:
			if id := testenv.Header(rec, route.HeaderID); id != first && id != after {
				t.Errorf("%s on %s: a parked key's event, or a bad one, went on", rec.Key, orders)
			}
		case rec.Topic == e.cfg.Checkpoint.Topic:
			if !strings.HasPrefix(string(rec.Key), "outbox_cdc/") {
				t.Errorf("a record in the checkpoint topic keyed %s: not the connector's", rec.Key)
			}
		default:
			t.Errorf("a record in %s (key %s): only %s, the parked and the checkpoint topic may have one", rec.Topic, rec.Key, orders)
		}
	}
	topics := topicsOf(t, kafka)
	for k, topic := range bad {
		if !strings.HasPrefix(topic, "__") && topic != tbl.ParkedTopic && topics.Has(topic) {
			t.Errorf("topic %q (the row of %s) was made", topic, k)
		}
	}
	if n := testenv.Value(t, r.p.Metrics().Registry, "cdc_parked_keys"); n != 6 {
		t.Errorf("cdc_parked_keys %v; want 6", n)
	}
}

// TestFormerParkedTopicStaysClosed (the attack on the gate): a table's
// parked_topic changed while a key was parked there. Its records stay
// the redrive's: a row routed to the old parked topic is refused as one
// routed to the new one is, and the old topic holds only the parking.
func TestFormerParkedTopicStaysClosed(t *testing.T) {
	e := parkEnv(t, config.DeliveryAtLeastOnce)
	e.cfg.Kafka.MaxMessageBytes = 4900 // the share holds three parkings; k-1's 5 kB is too large
	p := e.kafka.Prefix
	tbl := e.cfg.Tables[0]
	tbl.Topic = "{aggregate_type}"
	old := p + "parked.old"
	tbl.ParkedTopic = old
	r := e.start(t)
	conn := testenv.Connect(t, e.db)
	poison, _ := insertEventTx(t, conn, p+"orders", "k-1", "E", `jsonb_build_object('pad', repeat('x', 5000))`)
	c := e.kafka.NewConsumer(t, e.kafka.AllTopics())
	c.WaitFor(t, time.Minute, "k-1 parked in the old parked topic", func(recs []*kgo.Record) bool { return parkedByID(recs, old)[poison] != nil })
	c.SettleConfirmed(t, time.Minute, e.db, "outbox_cdc")
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	tbl.ParkedTopic = p + "parked.new"
	r = e.start(t)
	squat, _ := insertEventTx(t, conn, old, "k-2", "E", `'{}'`)
	squat2, _ := insertEventTx(t, conn, p+"parked_old", "k-3", "E", `'{}'`)
	c.WaitFor(t, time.Minute, "k-2 and k-3 parked in the new parked topic", func(recs []*kgo.Record) bool {
		held := parkedByID(recs, tbl.ParkedTopic)
		return held[squat] != nil && held[squat2] != nil
	})
	c.SettleConfirmed(t, time.Minute, e.db, "outbox_cdc")
	for _, rec := range c.Records {
		if rec.Topic == old && string(rec.Key) != "k-1" {
			t.Errorf("a record of %s in the old parked topic: %v", rec.Key, rec.Headers)
		}
	}
	if n := testenv.Value(t, r.p.Metrics().Registry, "cdc_parked_keys"); n != 3 {
		t.Errorf("cdc_parked_keys %v; want 3", n)
	}
}

// TestTopicTheBrokersRefuseIsTheEventsProblem (issue 54 item 4, and the
// attack on the gate): the connector's principal may not write one topic
// a row routes to; the brokers refuse the record itself (not the topic's
// creation, which is allowed). The event's table's on_invalid handles it
// (parked, dead-lettered), the key's later event goes behind it or on,
// the other keys go on, and nothing stops; with fail, the stop names the
// event's topic and what to do. The brokers are kfake with ACLs: the
// connector is a user with every right but WRITE on that topic.
func TestTopicTheBrokersRefuseIsTheEventsProblem(t *testing.T) {
	const pass = "acl-test-password"
	admin := kgo.SASL(scram.Auth{User: "admin", Pass: pass}.AsSha512Mechanism())
	for _, tc := range []struct{ policy, mode string }{{outbox.OnInvalidPark, config.DeliveryAtLeastOnce}, {outbox.OnInvalidPark, config.DeliveryExactlyOnce},
		{outbox.OnInvalidDeadLetter, config.DeliveryAtLeastOnce}, {outbox.OnInvalidFail, config.DeliveryAtLeastOnce}} {
		policy := tc.policy
		t.Run(policy+"/"+tc.mode, func(t *testing.T) {
			prefix := testenv.UniquePrefix()
			secret := prefix + "secret"
			all := func(res kmsg.ACLResourceType, name string) kfake.ACL {
				return kfake.ACL{Resource: res, Name: name, Pattern: kmsg.ACLResourcePatternTypeLiteral, Operation: kmsg.ACLOperationAll, Allow: true}
			}
			kafka := testenv.NewFakeKafka(t, kfake.EnableSASL(), kfake.EnableACLs(), kfake.Superuser(sink.SASLScram512, "admin", pass),
				kfake.User(sink.SASLScram512, "cdc", pass,
					all(kmsg.ACLResourceTypeTopic, "*"), all(kmsg.ACLResourceTypeGroup, "*"),
					all(kmsg.ACLResourceTypeCluster, "kafka-cluster"), all(kmsg.ACLResourceTypeTransactionalId, "*"),
					kfake.ACL{Resource: kmsg.ACLResourceTypeTopic, Name: secret, Pattern: kmsg.ACLResourcePatternTypeLiteral, Operation: kmsg.ACLOperationWrite}))
			kafka.Prefix = prefix
			e := newEnv(t, kafka)
			e.cfg.Kafka.SASL = sink.SASLConfig{Mechanism: sink.SASLScram512, Username: "cdc", Password: pass}
			e.cfg.Delivery = tc.mode
			tbl := e.cfg.Tables[0]
			tbl.Topic = prefix + "{aggregate_type}"
			tbl.OnInvalid = policy
			if policy == outbox.OnInvalidPark {
				tbl.ParkedTopic = prefix + "outbox.parked"
			}
			tbl.DeadLetterTopic = prefix + "dead-letters"
			r := e.start(t)
			conn := testenv.Connect(t, e.db)
			c := kafka.NewConsumer(t, kafka.AllTopics(), admin)
			if tc.mode == config.DeliveryExactlyOnce {
				c = kafka.NewCommittedConsumer(t, kafka.AllTopics(), admin)
			}
			first, _ := insertEventTx(t, conn, "orders", "a-1", "E", `'{}'`)
			// The refused record is alone in its produce request, as the
			// brokers answer per topic and the test's fault is per topic.
			c.WaitFor(t, time.Minute, "the first event", func(recs []*kgo.Record) bool { return ids(recs)[first] == 1 })
			refused, _ := insertEventTx(t, conn, "secret", "a-2", "E", `'{}'`)
			if policy == outbox.OnInvalidFail {
				err := waitFatal(t, r)
				if err == nil || !strings.Contains(err.Error(), refused) || !strings.Contains(err.Error(), secret) || !strings.Contains(err.Error(), "write the topic") {
					t.Fatalf("Run returned %v; want a stop naming the event %s, its topic and what to do", err, refused)
				}
				return
			}
			behind, _ := insertEventTx(t, conn, "orders", "a-2", "E", `'{}'`)
			after, _ := insertEventTx(t, conn, "orders", "a-3", "E", `'{}'`)
			aside := tbl.DeadLetterTopic
			if policy == outbox.OnInvalidPark {
				aside = tbl.ParkedTopic
			}
			c.WaitFor(t, time.Minute, "the refused event set aside, and the next key's event", func(recs []*kgo.Record) bool {
				return ids(recs)[after] >= 1 && parkedByID(recs, aside)[refused] != nil
			})
			c.SettleConfirmed(t, time.Minute, e.db, "outbox_cdc")
			if why := testenv.Header(parkedByID(c.Records, aside)[refused], route.HeaderDeadLetterError); !strings.Contains(why, "TOPIC_AUTHORIZATION_FAILED") {
				t.Errorf("set aside for %q; want the brokers' answer", why)
			}
			onTopic := ids(inTopic(c.Records, prefix+"orders"))
			// At least once, a-2's later event, to another topic, may have
			// gone in the session the refusal ended, before the brokers
			// answered (another topic: Kafka orders no two); from the next
			// session on it parks. Exactly once, that session's
			// transaction is aborted.
			if policy == outbox.OnInvalidPark && tc.mode == config.DeliveryExactlyOnce && onTopic[behind] != 0 {
				t.Errorf("a-2's later event went on past its parked first")
			}
			if policy == outbox.OnInvalidDeadLetter && onTopic[behind] == 0 {
				t.Errorf("a-2's later event is not on its topic")
			}
			for _, rec := range c.Records {
				if rec.Topic == secret {
					t.Errorf("a record in the refused topic")
				}
			}
			select {
			case err := <-r.done:
				close(r.done)
				t.Fatalf("the pipeline stopped: %v", err)
			default:
			}
			if n := counterValue(r.p.Metrics().Restarts); n != 1 {
				t.Errorf("%v sessions restarted; want 1 (the refusal's)", n)
			}
		})
	}
}

// TestSquattedInternalTopicStopsAtStart: a topic Kafka takes for the
// dead-letter topic exists (made by hand, or by a row before the gate
// compared names so): the dead-letter topic cannot be made, so the start
// stops with one line naming both, rather than failing later on the
// first dead letter.
func TestSquattedInternalTopicStopsAtStart(t *testing.T) {
	kafka := testenv.NewKafka(t)
	e := newEnv(t, kafka)
	e.cfg.Tables[0].OnInvalid = outbox.OnInvalidDeadLetter
	e.cfg.Tables[0].DeadLetterTopic = kafka.Prefix + "dead.letters"
	squatter := kafka.Prefix + "dead_letters"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	adm := kadm.NewClient(kafka.Client(t))
	if _, err := adm.CreateTopic(ctx, 1, 1, nil, squatter); err != nil {
		t.Fatal(err)
	}
	// A broker knows of a topic a moment after its controller made it
	// (Apache Kafka; kfake at once): until then the start's check sees
	// none, and the connector made its own.
	testenv.Eventually(t, 30*time.Second, "the squatting topic to be listed with a leader", func() bool {
		topics, err := adm.ListTopics(ctx, squatter)
		return err == nil && topics.Has(squatter) && topics[squatter].Err == nil
	})
	r := e.launch(t, discard{})
	err := waitFatal(t, r)
	want := fmt.Sprintf("%q", squatter)
	if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "dead_letter_topic") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("Run returned %v; want one line naming the topic %s that keeps the dead-letter topic from being made", err, squatter)
	}
}

// TestRotatedSigningKeyKeepsParkedKeysRedrivable (the attack on the
// redrive): a key parks under signing key A; A is rotated out the way
// docs/security.md says (B first, A after it), more of the key's events
// park, sealed with B; then A leaves the file while the key is still
// parked. The start warns, and a redrive, with --accept-gap or without,
// refuses naming A's id and sends nothing (it once read every A-sealed
// record as forged, blamed retention, and with --accept-gap un-parked
// the key having sent none of them). With A back after B, the redrive
// sends every event, in order.
func TestRotatedSigningKeyKeepsParkedKeysRedrivable(t *testing.T) {
	e := parkEnv(t, config.DeliveryAtLeastOnce)
	keyA, keyB := []byte(testSigningKey), []byte("rotated-in-signing-key-0123456789abcdef")
	topic, parked := e.kafka.Prefix+"outbox.event.order", e.cfg.Tables[0].ParkedTopic
	r := e.start(t)
	c := e.kafka.NewConsumer(t, e.kafka.AllTopics())
	writeAggregates(t, e.db, 3, 1, 5, "agg-01", 2)
	c.WaitFor(t, time.Minute, "agg-01's 4 events parked", func(recs []*kgo.Record) bool { return len(seqs(t, recs, parked)["agg-01"]) == 4 })
	c.SettleConfirmed(t, time.Minute, e.db, "outbox_cdc")
	restart := func(keys ...[]byte) *testenv.Buffer {
		t.Helper()
		if err := r.stop(t); err != nil {
			t.Fatal(err)
		}
		e.cfg.Checkpoint.SigningKeys = keys
		logs := &testenv.Buffer{}
		e.logOut = logs
		r = e.start(t)
		return logs
	}
	restart(keyB, keyA)
	writeAggregates(t, e.db, 3, 6, 3, "", 0) // agg-01's 6 to 8 park behind, sealed with B
	c.WaitFor(t, time.Minute, "agg-01's 7 events parked", func(recs []*kgo.Record) bool { return len(seqs(t, recs, parked)["agg-01"]) == 7 })
	c.SettleConfirmed(t, time.Minute, e.db, "outbox_cdc")
	e.cfg.Kafka.MaxMessageBytes = 1 << 20
	logs := restart(keyB)
	if !strings.Contains(logs.String(), "sealed with a signing key checkpoint.signing_key_file no longer has") {
		t.Errorf("start log:\n%s\nwant a warning that the parked key cannot be redriven without its key", logs.String())
	}
	admin, err := pipeline.New(e.cfg, hclog.NewNullLogger(), pipeline.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, acceptGap := range []bool{false, true} {
		rd, err := admin.Ops().RequestRedrive(context.Background(), park.Selector{Key: "agg-01"}, false, acceptGap)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		done, _ := admin.Ops().WatchRedrive(ctx, rd)
		cancel()
		if len(done) != 1 || done[0].Done || !strings.Contains(done[0].Outcome, signing.ID(keyA)) || !strings.Contains(done[0].Outcome, "nothing sent") {
			t.Fatalf("redrive (accept gap %v) with A gone: %+v; want it refused, naming key %s", acceptGap, done, signing.ID(keyA))
		}
	}
	if n := testenv.Value(t, r.p.Metrics().Registry, "cdc_parked_keys"); n != 1 {
		t.Fatalf("cdc_parked_keys %v; want agg-01 still parked", n)
	}
	restart(keyB, keyA)
	admin, err = pipeline.New(e.cfg, hclog.NewNullLogger(), pipeline.Options{})
	if err != nil {
		t.Fatal(err)
	}
	redriveAll(t, admin, park.Selector{Key: "agg-01"}, false)
	c.WaitFor(t, time.Minute, "agg-01's 8 events on its topic", func(recs []*kgo.Record) bool { return len(seqs(t, recs, topic)["agg-01"]) >= 8 })
	c.SettleConfirmed(t, time.Minute, e.db, "outbox_cdc")
	if got := seqs(t, c.Records, topic)["agg-01"]; !inOrder(got, 1, 8) {
		t.Fatalf("agg-01 on its topic: %v; want 1 to 8 in order, each once", got)
	}
}

// TestDropFirstCountsItsDeadLetterOnce (the attack on the redrive): cdc
// redrive --drop-first builds the first event's dead letter in its check
// pass and again as it sends; it is one dead letter, counted and logged
// once (it was counted twice: cdc_dead_letters_total 2, the
// stopped line's dead_lettered 2, two log lines).
func TestDropFirstCountsItsDeadLetterOnce(t *testing.T) {
	e := parkEnv(t, config.DeliveryAtLeastOnce)
	topic, parked := e.kafka.Prefix+"outbox.event.order", e.cfg.Tables[0].ParkedTopic
	e.cfg.Tables[0].DeadLetterTopic = e.kafka.Prefix + "dead-letters"
	var logs testenv.Buffer
	e.logOut = &logs
	r := e.start(t)
	c := e.kafka.NewConsumer(t, e.kafka.AllTopics())
	writeAggregates(t, e.db, 2, 1, 4, "agg-01", 2)
	c.WaitFor(t, time.Minute, "agg-01's 3 events parked", func(recs []*kgo.Record) bool { return len(seqs(t, recs, parked)["agg-01"]) == 3 })
	redriveAll(t, r.p, park.Selector{Key: "agg-01"}, true)
	c.WaitFor(t, time.Minute, "agg-01's 3 and 4 on its topic", func(recs []*kgo.Record) bool { return len(seqs(t, recs, topic)["agg-01"]) >= 3 })
	c.SettleConfirmed(t, time.Minute, e.db, "outbox_cdc")
	dead := inTopic(c.Records, e.cfg.Tables[0].DeadLetterTopic)
	if len(dead) != 1 {
		t.Fatalf("%d dead letters; want the dropped first event's one", len(dead))
	}
	if n := testenv.Counter(t, r.p.Metrics().Registry, "cdc_dead_letters_total", "source", "public.outbox"); n != 1 {
		t.Errorf("cdc_dead_letters_total %v; want 1", n)
	}
	if n := r.p.DeadLettered.Load(); n != 1 {
		t.Errorf("dead_lettered %d; want 1", n)
	}
	if n := strings.Count(logs.String(), "event sent to the dead-letter topic"); n != 1 {
		t.Errorf("%d log lines of the dead letter; want 1:\n%s", n, logs.String())
	}
}
