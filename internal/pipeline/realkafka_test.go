//go:build realkafka

package pipeline_test

// Behaviour only a real Apache Kafka broker shows. `make test-kafka` builds
// with -tags realkafka and starts the broker with scripts/kafka.sh; these
// tests fail (never skip) without it.

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxcdc/cdc/internal/fault"
	"github.com/outboxcdc/cdc/internal/opt"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/route"
	"github.com/outboxcdc/cdc/internal/sink"
	"github.com/outboxcdc/cdc/internal/testenv"
)

func realKafka(t *testing.T) *testenv.Kafka {
	t.Helper()
	if !testenv.External() {
		t.Fatal("CDC_TEST_KAFKA_BROKERS is not set: run these tests with make test-kafka, which starts a real broker")
	}
	return testenv.NewKafka(t)
}

func adminClient(t *testing.T, k *testenv.Kafka) *kadm.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return kadm.NewClient(cl)
}

// TestRealMissingTopicWithoutAutoCreation: the topic does not exist and
// neither the connector nor the broker may create it. It stops with an
// error naming the topic and the fix, and confirms nothing past the event.
func TestRealMissingTopicWithoutAutoCreation(t *testing.T) {
	k := realKafka(t)
	e := newEnv(t, k)
	e.cfg.Kafka.AllowAutoTopicCreation = opt.Set(false)
	e.cfg.Kafka.CreateTopics = opt.Set(false)
	r := e.start(t)
	before := testenv.CurrentWAL(t, e.db)
	id, xid := insertEventTx(t, testenv.Connect(t, e.db), "order", "m-1", "Missing", `'{}'`)
	commit := testenv.CommitLSN(t, e.db, xid, before)
	err := waitFatal(t, r)
	var pe *sink.ProduceError
	topic := k.Prefix + "outbox.event.order"
	if !errors.As(err, &pe) || !fault.Permanent(err) || !errors.Is(err, kerr.UnknownTopicOrPartition) ||
		!strings.Contains(err.Error(), topic) || !strings.Contains(err.Error(), "the topic does not exist, and the connector may not create it") {
		t.Fatalf("Run returned %v; want a permanent UNKNOWN_TOPIC_OR_PARTITION error naming %s and the fix", err, topic)
	}
	if pos := testenv.SlotPosition(t, e.db, "outbox_cdc"); pos > commit {
		t.Fatalf("confirmed_flush_lsn %s passed the undeliverable event's transaction (commit record at %s)", pos, commit)
	}
	if !testenv.Pending(t, e.db, "outbox_cdc", "outbox_cdc", id) {
		t.Fatalf("the slot no longer holds event %s", id)
	}
}

// TestRealCreatesMissingTopics: with broker auto-creation off for the
// connector, it creates a new topic itself, with kafka.topic_defaults.
func TestRealCreatesMissingTopics(t *testing.T) {
	k := realKafka(t)
	e := newEnv(t, k)
	e.cfg.Kafka.AllowAutoTopicCreation = opt.Set(false)
	e.cfg.Kafka.TopicDefaults = sink.TopicDefaults{Partitions: 2, ReplicationFactor: 1, Configs: map[string]string{"retention.ms": "3600000"}}
	e.start(t)
	id := insertEvent(t, testenv.Connect(t, e.db), "c-1", "Created")
	c := k.NewConsumer(t, k.AllTopics())
	c.WaitFor(t, time.Minute, "the event", func(recs []*kgo.Record) bool { return ids(recs)[id] > 0 })
	topic := k.Prefix + "outbox.event.order"
	adm := adminClient(t, k)
	td, err := adm.ListTopics(context.Background(), topic)
	if err != nil || len(td[topic].Partitions) != 2 {
		t.Fatalf("topic %s: %v, %+v; want 2 partitions", topic, err, td[topic])
	}
	rc, err := adm.DescribeTopicConfigs(context.Background(), topic)
	if err != nil {
		t.Fatal(err)
	}
	cfg, _ := rc.On(topic, nil)
	for _, c := range cfg.Configs {
		if c.Key == "retention.ms" && (c.Value == nil || *c.Value != "3600000") {
			t.Fatalf("retention.ms = %v, want the topic_defaults value", c.Value)
		}
	}
}

// TestRealBrokerAutoCreatesTopic: the connector may not create topics and
// relies on the broker's auto-creation (on in make test-kafka's broker):
// the topic is created when the connector asks for it, and the event
// arrives.
func TestRealBrokerAutoCreatesTopic(t *testing.T) {
	k := realKafka(t)
	e := newEnv(t, k)
	e.cfg.Kafka.CreateTopics = opt.Set(false)
	e.cfg.Kafka.AllowAutoTopicCreation = opt.Set(true)
	e.start(t)
	id := insertEvent(t, testenv.Connect(t, e.db), "a-1", "AutoCreated")
	c := k.NewConsumer(t, k.AllTopics())
	c.WaitFor(t, time.Minute, "the event", func(recs []*kgo.Record) bool { return ids(recs)[id] > 0 })
	for _, r := range c.Records {
		if want := k.Prefix + "outbox.event.order"; r.Topic != want {
			t.Fatalf("event in %s, want %s", r.Topic, want)
		}
	}
}

// TestRealRecordOverTopicMaxMessageBytes: the broker refuses a record larger
// than the topic's max.message.bytes; the connector stops and says what to
// change, and nothing past it is confirmed.
func TestRealRecordOverTopicMaxMessageBytes(t *testing.T) {
	k := realKafka(t)
	e := newEnv(t, k)
	topic := k.Prefix + "outbox.event.order"
	maxBytes := "10000"
	resp, err := adminClient(t, k).CreateTopic(context.Background(), 1, 1, map[string]*string{"max.message.bytes": &maxBytes}, topic)
	if err != nil || resp.Err != nil {
		t.Fatalf("create topic: %v %v", err, resp.Err)
	}
	r := e.start(t)
	conn := testenv.Connect(t, e.db)
	small := insertEvent(t, conn, "big-1", "Small")
	c := k.NewConsumer(t, "^"+strings.ReplaceAll(topic, ".", `\.`)+"$")
	c.WaitCount(t, time.Minute, 1)

	before := testenv.CurrentWAL(t, e.db)
	// max.message.bytes limits the compressed batch: the payload must not
	// compress below it, so it is random hex, not a repeated character.
	big, xid := insertEventTx(t, conn, "order", "big-1", "Huge",
		`jsonb_build_object('blob', (SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 2000)))`)
	commit := testenv.CommitLSN(t, e.db, xid, before)
	err = waitFatal(t, r)
	var pe *sink.ProduceError
	if !errors.As(err, &pe) || !fault.Permanent(err) || !errors.Is(err, kerr.MessageTooLarge) || !strings.Contains(err.Error(), "max.message.bytes") {
		t.Fatalf("Run returned %v; want a permanent MESSAGE_TOO_LARGE error that names max.message.bytes", err)
	}
	if pos := testenv.SlotPosition(t, e.db, "outbox_cdc"); pos > commit {
		t.Fatalf("confirmed_flush_lsn %s passed the oversized event's transaction (commit record at %s)", pos, commit)
	}
	if !testenv.Pending(t, e.db, "outbox_cdc", "outbox_cdc", big) {
		t.Fatalf("the slot no longer holds event %s", big)
	}
	if got := ids(c.Records); got[small] != 1 || got[big] != 0 {
		t.Fatalf("delivered %v", got)
	}
}

// TestRealBrokerStoppedFor30s: the broker goes away mid-stream for 30 s and
// comes back. The replication session survives (status updates continue,
// here against a 5 s wal_sender_timeout), and every event is delivered.
func TestRealBrokerStoppedFor30s(t *testing.T) {
	realKafka(t)
	// A broker of its own: the suite's is shared with tests running beside
	// this one (scripts/gotest.sh runs the package in several processes).
	broker := testenv.StartBroker(t)
	k := broker.Kafka()
	e := newEnv(t, k)
	e.cfg.Postgres.URL += "&options=-c%20wal_sender_timeout%3D5000"
	e.cfg.Postgres.StatusInterval = 200 * time.Millisecond
	logs := &testenv.Buffer{}
	e.logLevel = hclog.Info
	r := e.launch(t, logs)
	testenv.Eventually(t, 30*time.Second, "the pipeline to start streaming", func() bool { return r.tracker.Load() != nil })
	session := r.tracker.Load()
	conn := testenv.Connect(t, e.db)
	var pid int
	testenv.QueryRow(t, e.db, `SELECT active_pid FROM pg_replication_slots WHERE slot_name = 'outbox_cdc'`, nil, &pid)

	var want []string
	write := func(n int, typ string) {
		for i := 0; i < n; i++ {
			want = append(want, insertEvent(t, conn, fmt.Sprintf("b-%d", i%7), typ))
		}
	}
	write(50, "BeforeStop")
	c := k.NewConsumer(t, k.AllTopics())
	c.WaitCount(t, time.Minute, 50)

	broker.Stop(t)
	stopped := time.Now()
	write(100, "DuringStop")
	for time.Since(stopped) < 30*time.Second {
		var walsender int
		testenv.QueryRow(t, e.db, `SELECT coalesce((SELECT active_pid FROM pg_replication_slots WHERE slot_name = 'outbox_cdc'), 0)`, nil, &walsender)
		if walsender != pid {
			t.Fatalf("walsender changed from %d to %d while the broker was down: the replication session was dropped", pid, walsender)
		}
		time.Sleep(time.Second) // observation interval during the outage, not synchronisation
	}
	broker.Start(t)
	write(50, "AfterStart")
	c.WaitFor(t, 2*time.Minute, "every event after the broker came back", func(recs []*kgo.Record) bool {
		got := ids(recs)
		for _, id := range want {
			if got[id] == 0 {
				return false
			}
		}
		return true
	})
	if r.tracker.Load() != session {
		t.Fatal("the replication session restarted because of the broker outage")
	}
	// One line when Kafka stalls, one when it recovers; not one per retry.
	testenv.Eventually(t, time.Minute, "the recovery log line", func() bool {
		return strings.Contains(logs.String(), "kafka acknowledges events again")
	})
	if !strings.Contains(logs.String(), "kafka has not acknowledged any event recently") {
		t.Errorf("no log line said that Kafka stalled:\n%s", logs)
	}
	if n := strings.Count(logs.String(), "[WARN]"); n > 2 {
		t.Errorf("%d warning lines for one outage; want one per state change:\n%s", n, logs)
	}
	end := testenv.CurrentWAL(t, e.db)
	testenv.Eventually(t, time.Minute, "the slot to confirm everything", func() bool { return testenv.SlotPosition(t, e.db, "outbox_cdc") >= end })
}

// TestRealDeadLetterOverMaxMessageBytes: with on_invalid: dead-letter, an
// event larger than the topic allows goes to the dead-letter topic (which
// allows more), and streaming goes on.
func TestRealDeadLetterOverMaxMessageBytes(t *testing.T) {
	k := realKafka(t)
	e := newEnv(t, k)
	topic := k.Prefix + "outbox.event.order"
	dlq := k.Prefix + "outbox.dead-letter"
	maxBytes := "10000"
	resp, err := adminClient(t, k).CreateTopic(context.Background(), 1, 1, map[string]*string{"max.message.bytes": &maxBytes}, topic)
	if err != nil || resp.Err != nil {
		t.Fatalf("create topic: %v %v", err, resp.Err)
	}
	e.cfg.Kafka.MaxMessageBytes = 10000 // mirrors the topic, so oversized events are caught before sending
	e.cfg.Tables[0].OnInvalid = outbox.OnInvalidDeadLetter
	e.cfg.Tables[0].DeadLetterTopic = dlq
	e.start(t)
	conn := testenv.Connect(t, e.db)
	big, _ := insertEventTx(t, conn, "order", "big-1", "Huge",
		`jsonb_build_object('blob', (SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 2000)))`)
	after := insertEvent(t, conn, "big-1", "After")
	c := k.NewConsumer(t, k.AllTopics())
	c.WaitFor(t, time.Minute, "the dead letter and the next event", func(recs []*kgo.Record) bool {
		dead := false
		for _, r := range recs {
			dead = dead || (r.Topic == dlq && testenv.Header(r, route.HeaderDeadLetterID) == big)
		}
		return dead && ids(recs)[after] > 0
	})
	for _, r := range c.Records {
		if r.Topic == dlq {
			if len(r.Value) < 64000 || !strings.Contains(testenv.Header(r, route.HeaderDeadLetterError), "max_message_bytes") {
				t.Errorf("dead letter: %d bytes, error %q", len(r.Value), testenv.Header(r, route.HeaderDeadLetterError))
			}
		}
	}
	end := testenv.CurrentWAL(t, e.db)
	testenv.Eventually(t, 30*time.Second, "the slot to pass everything", func() bool { return testenv.SlotPosition(t, e.db, "outbox_cdc") >= end })
}

// TestRealSecuredKafka: a real broker with a SASL_SSL listener (SCRAM over
// TLS, certificates made by the test). The connector streams through it,
// checkpoints included; a wrong password and an untrusted certificate each
// stop it at once with one line naming the setting.
func TestRealSecuredKafka(t *testing.T) {
	realKafka(t)
	certs := testenv.NewCerts(t)
	broker := testenv.StartBroker(t, "CDC_KAFKA_SECURE_PEM="+certs.ServerPEM, "CDC_KAFKA_SCRAM=cdc:cdc-secret")
	if len(broker.Secure) == 0 {
		t.Fatal("the broker has no SASL_SSL listener")
	}
	// One topic prefix (and so checkpoint topic) per subtest: they share a
	// cluster and a slot name, so one checkpoint would be a gap to the next.
	kafka := func(name string) *testenv.Kafka {
		return &testenv.Kafka{Brokers: broker.Brokers, Prefix: "secure-" + strings.ToLower(name) + "."}
	}
	// Every run logs at trace level with franz-go's wire log on, into a
	// log swept for both passwords.
	secured := func(t *testing.T, e *env, mechanism, password, ca string) {
		e.logLevel, e.cfg.Kafka.ClientLog = hclog.Trace, "debug"
		e.logOut = sweptLog(t, 2, "cdc-secret", "not-the-secret")
		e.cfg.Kafka.Brokers = broker.Secure
		e.cfg.Kafka.TLS = sink.TLSConfig{CAFile: ca}
		e.cfg.Kafka.SASL = sink.SASLConfig{Mechanism: mechanism, Username: "cdc", Password: password}
	}
	for _, mech := range []string{sink.SASLScram256, sink.SASLScram512} {
		t.Run(mech, func(t *testing.T) {
			k := kafka(mech)
			e := newEnv(t, k)
			secured(t, e, mech, "cdc-secret", certs.CAFile)
			e.start(t)
			id := insertEvent(t, testenv.Connect(t, e.db), "s-1", "OverSASL")
			c := k.NewConsumer(t, k.AllTopics()) // over the plaintext listener
			c.WaitFor(t, time.Minute, "the event", func(recs []*kgo.Record) bool { return ids(recs)[id] > 0 })
		})
	}
	for _, tc := range []struct {
		name, password, ca, want string
	}{
		{"wrong password", "not-the-secret", certs.CAFile, "kafka rejected the SASL SCRAM-SHA-256 credentials (SASL_AUTHENTICATION_FAILED): check kafka.sasl.username and kafka.sasl.password"},
		{"untrusted certificate", "cdc-secret", testenv.NewCerts(t).CAFile, "set kafka.tls.ca_file to the CA that signs the brokers' certificates"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, kafka(strings.ReplaceAll(tc.name, " ", "-")))
			secured(t, e, sink.SASLScram256, tc.password, tc.ca)
			r := e.launch(t, e.logOut)
			err := waitFatal(t, r)
			var ce *sink.ConnectError
			if !errors.As(err, &ce) || !fault.Permanent(err) || !strings.Contains(err.Error(), tc.want) ||
				strings.Contains(err.Error(), tc.password) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("Run returned %v; want a permanent one-line error saying %q, without the password", err, tc.want)
			}
			if n := counterValue(r.p.Metrics().Restarts); n != 0 {
				t.Fatalf("it gave up after %v sessions retried: a setting error must stop it at once", n)
			}
		})
	}
}

// TestRealNewTopicsOnAFreshBroker: on a broker that has just started, six
// writers each send events to brand-new topics at once. The connector must
// not exit while the topics are being created: ten tries, each on a fresh
// broker, and every event delivered.
func TestRealNewTopicsOnAFreshBroker(t *testing.T) {
	realKafka(t)
	tries := 10
	for try := 0; try < tries; try++ {
		t.Run(fmt.Sprintf("try %d", try+1), func(t *testing.T) {
			broker := testenv.StartBroker(t)
			k := &testenv.Kafka{Brokers: broker.Brokers, Prefix: fmt.Sprintf("fresh%d.", try)}
			e := newEnv(t, k)
			r := e.start(t)
			var wg sync.WaitGroup
			var mu sync.Mutex
			var want []string
			for w := 0; w < 6; w++ {
				wg.Add(1)
				go func(w int) {
					defer wg.Done()
					conn := testenv.Connect(t, e.db)
					for i := 0; i < 12; i++ {
						id, _ := insertEventTx(t, conn, fmt.Sprintf("w%d-topic%d", w, i%3), fmt.Sprintf("k-%d", i), "New", `'{}'`)
						mu.Lock()
						want = append(want, id)
						mu.Unlock()
					}
				}(w)
			}
			wg.Wait()
			c := k.NewConsumer(t, k.AllTopics())
			c.WaitFor(t, 2*time.Minute, "every event on the new topics", func(recs []*kgo.Record) bool {
				select {
				case err := <-r.done:
					r.done <- err
					t.Fatalf("the connector exited: %v", err)
				default:
				}
				got := ids(recs)
				for _, id := range want {
					if got[id] == 0 {
						return false
					}
				}
				return true
			})
		})
	}
}

// TestRealDeadLetterTooLarge: an event too large for its topic, whose dead
// letter is too large too. Over kafka.dead_letter_max_message_bytes, the
// dead letter is cut to fit, keeping the reason, and marked so (issue 37:
// a row's problem is the row's, not the stream's). Refused by the broker
// because the dead-letter topic's max.message.bytes is lower than the
// setting (a configuration that contradicts itself), the connector stops
// naming kafka.dead_letter_max_message_bytes, and nothing past it is
// confirmed.
func TestRealDeadLetterTooLarge(t *testing.T) {
	for _, tc := range []struct {
		name      string
		dlqLimit  int32  // kafka.dead_letter_max_message_bytes
		dlqBroker string // the dead-letter topic's max.message.bytes
	}{
		{"over the setting", 20000, ""},
		{"refused by the broker", 1_000_000, "15000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := realKafka(t)
			e := newEnv(t, k)
			dlq := k.Prefix + "outbox.dead-letter"
			if tc.dlqBroker != "" {
				v := tc.dlqBroker
				if resp, err := adminClient(t, k).CreateTopic(context.Background(), 1, 1, map[string]*string{"max.message.bytes": &v}, dlq); err != nil || resp.Err != nil {
					t.Fatalf("create topic: %v %v", err, resp.Err)
				}
			}
			e.cfg.Kafka.MaxMessageBytes = 10000
			e.cfg.Kafka.DeadLetterMaxMessageBytes = tc.dlqLimit
			e.cfg.Tables[0].OnInvalid = outbox.OnInvalidDeadLetter
			e.cfg.Tables[0].DeadLetterTopic = dlq
			r := e.start(t)
			before := testenv.CurrentWAL(t, e.db)
			big, xid := insertEventTx(t, testenv.Connect(t, e.db), "order", "big-1", "Huge",
				`jsonb_build_object('blob', (SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 2000)))`)
			commit := testenv.CommitLSN(t, e.db, xid, before)
			if tc.dlqBroker == "" {
				c := k.NewConsumer(t, "^"+regexp.QuoteMeta(dlq)+"$")
				c.WaitCount(t, time.Minute, 1)
				rec := c.Records[0]
				if testenv.Header(rec, route.HeaderDeadLetterID) != big || testenv.Header(rec, route.HeaderDeadLetterTruncated) == "" ||
					!strings.Contains(testenv.Header(rec, route.HeaderDeadLetterError), "kafka.max_message_bytes") || len(rec.Value) >= 20000 {
					t.Fatalf("dead letter %d bytes, headers %v; want the event's, cut and marked, with its reason", len(rec.Value), rec.Headers)
				}
				after := insertEvent(t, testenv.Connect(t, e.db), "agg-1", "After")
				k.NewConsumer(t, k.AllTopics()).WaitFor(t, time.Minute, "the event after", func(recs []*kgo.Record) bool { return ids(recs)[after] == 1 })
				return
			}
			err := waitFatal(t, r)
			if !fault.Permanent(err) || !strings.Contains(err.Error(), "kafka.dead_letter_max_message_bytes") {
				t.Fatalf("Run returned %v; want a permanent error naming kafka.dead_letter_max_message_bytes", err)
			}
			if pos := testenv.SlotPosition(t, e.db, "outbox_cdc"); pos > commit {
				t.Fatalf("confirmed_flush_lsn %s passed the event (commit %s)", pos, commit)
			}
		})
	}
}
