package pipeline_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/outboxcdc/cdc/internal/config"
	"github.com/outboxcdc/cdc/internal/fault"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/pipeline"
	"github.com/outboxcdc/cdc/internal/replay"
	"github.com/outboxcdc/cdc/internal/route"
	registry "github.com/outboxcdc/cdc/internal/schema"
	"github.com/outboxcdc/cdc/internal/setup"
	"github.com/outboxcdc/cdc/internal/testenv"
	"github.com/outboxcdc/cdc/internal/testenv/testregistry"
)

const (
	orderAvro = `{"type":"record","name":"Order","namespace":"shop","fields":[` +
		`{"name":"id","type":"string"},{"name":"qty","type":"int"}]}`
	// orderAvroV2 adds a field with a default (backward compatible).
	orderAvroV2 = `{"type":"record","name":"Order","namespace":"shop","fields":[` +
		`{"name":"id","type":"string"},{"name":"qty","type":"int"},{"name":"currency","type":"string","default":"EUR"}]}`
	orderJSONSchema = `{"type":"object","required":["id","qty"],"properties":{"id":{"type":"string"},"qty":{"type":"integer","minimum":1}}}`
	orderProto      = `syntax = "proto3"; package shop; message Order { string id = 1; int32 qty = 2; }`
)

// schemaEnv is newEnv with the outbox table's payload under a registry
// schema, dead-lettering what does not match: the real registry of
// CDC_TEST_REGISTRY_URL, or srfake. Its subjects carry the Kafka prefix.
func schemaEnv(t *testing.T, format, idIn string) (*env, *testregistry.Registry) {
	t.Helper()
	return schemaEnvOn(t, testregistry.New(t), format, idIn)
}

// fakeSchemaEnv is schemaEnv on srfake, for the tests that take the
// registry down or answer in its place.
func fakeSchemaEnv(t *testing.T, format, idIn string) (*env, *testregistry.Registry) {
	t.Helper()
	return schemaEnvOn(t, testregistry.NewFake(t), format, idIn)
}

func schemaEnvOn(t *testing.T, reg *testregistry.Registry, format, idIn string) (*env, *testregistry.Registry) {
	t.Helper()
	e := newEnv(t, testenv.NewKafka(t))
	tb := e.cfg.Tables[0]
	tb.Schema = outbox.Schema{Format: format, IDIn: idIn}
	tb.OnInvalid, tb.DeadLetterTopic = outbox.OnInvalidDeadLetter, e.kafka.Prefix+"dead-letters"
	e.cfg.SchemaRegistry = registry.Config{URL: reg.URL}
	return e, reg
}

func byKey(recs []*kgo.Record, key string) []*kgo.Record {
	var out []*kgo.Record
	for _, r := range recs {
		if string(r.Key) == key {
			out = append(out, r)
		}
	}
	return out
}

func sameJSON(t *testing.T, got, want string) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal([]byte(got), &g); err != nil {
		t.Fatalf("decoded %q: %v", got, err)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(g, w) {
		t.Fatalf("decoded %s, want %s", got, want)
	}
}

// TestSchemaFormatsEndToEnd: for each wire format, through Postgres, the
// broker and the registry: a row already in the table (backfilled on the
// first start), a live event and an invalid one. A registry-aware consumer
// reads the two valid ones back as written; the invalid one is in the
// dead-letter topic, as written, with the validation error in a header.
// With Avro, a schema evolved while streaming is used for the next event.
func TestSchemaFormatsEndToEnd(t *testing.T) {
	for _, tc := range []struct {
		format, idIn, schema string
		typ                  sr.SchemaType
		invalid              string
		want                 func(id string, qty int) string // the decoded form
	}{
		{outbox.SchemaAvro, "", orderAvro, sr.TypeAvro, `{"id": "o-2", "qty": "two"}`,
			func(id string, qty int) string { return `{"id":"` + id + `","qty":` + strconv.Itoa(qty) + `}` }},
		{outbox.SchemaJSONSchema, outbox.IDInHeader, orderJSONSchema, sr.TypeJSON, `{"id": "o-2", "qty": 0}`,
			func(id string, qty int) string { return `{"id":"` + id + `","qty":` + strconv.Itoa(qty) + `}` }},
		{outbox.SchemaProtobuf, "", orderProto, sr.TypeProtobuf, `{"id": "o-2", "qty": "two"}`,
			func(id string, qty int) string { return `{"id":"` + id + `","qty":` + strconv.Itoa(qty) + `}` }},
	} {
		t.Run(tc.format, func(t *testing.T) {
			e, reg := schemaEnv(t, tc.format, tc.idIn)
			subject := e.kafka.Prefix + "outbox.event.order-value"
			id, _, err := reg.RegisterSchema(subject, sr.Schema{Schema: tc.schema, Type: tc.typ})
			if err != nil {
				t.Fatal(err)
			}
			e.cfg.Tables[0].Backfill = &outbox.BackfillOptions{}
			conn := testenv.Connect(t, e.db)
			insertEventTx(t, conn, "order", "k-0", "OrderPlaced", `'{"id": "o-0", "qty": 5}'`)
			r := e.start(t)
			insertEventTx(t, conn, "order", "k-1", "OrderPlaced", `'{"id": "o-1", "qty": 1}'`)
			insertEventTx(t, conn, "order", "k-2", "OrderPlaced", `'`+tc.invalid+`'`)
			c := e.kafka.NewConsumer(t, e.kafka.AllTopics())
			c.WaitCount(t, time.Minute, 3)
			for i, key := range []string{"k-0", "k-1"} {
				recs := byKey(c.Records, key)
				if len(recs) != 1 || recs[0].Topic != e.kafka.Prefix+"outbox.event.order" {
					t.Fatalf("%s: %d records (%v)", key, len(recs), recs)
				}
				gotID, doc := reg.Decode(t, recs[0])
				if gotID != id {
					t.Fatalf("%s: schema id %d, want %d", key, gotID, id)
				}
				sameJSON(t, doc, tc.want("o-"+strconv.Itoa(i), []int{5, 1}[i]))
			}
			dl := byKey(c.Records, "k-2")
			if len(dl) != 1 || dl[0].Topic != e.kafka.Prefix+"dead-letters" || string(dl[0].Value) != tc.invalid ||
				!strings.Contains(testenv.Header(dl[0], route.HeaderDeadLetterError), `does not match schema subject "`+subject+`"`) {
				t.Fatalf("the invalid event: %v", dl)
			}
			if n := testenv.Counter(t, r.p.Metrics().Registry, "cdc_schema_invalid_total", "source", "public.outbox"); n != 1 {
				t.Fatalf("cdc_schema_invalid_total = %v, want 1", n)
			}
			if tc.format != outbox.SchemaAvro {
				return
			}
			v2, _, err := reg.RegisterSchema(subject, sr.Schema{Schema: orderAvroV2, Type: sr.TypeAvro})
			if err != nil {
				t.Fatal(err)
			}
			insertEventTx(t, conn, "order", "k-3", "OrderPlaced", `'{"id": "o-3", "qty": 2, "currency": "USD"}'`)
			c.WaitFor(t, time.Minute, "the event of the evolved schema", func([]*kgo.Record) bool { return len(byKey(c.Records, "k-3")) > 0 })
			if gotID, doc := reg.Decode(t, byKey(c.Records, "k-3")[0]); gotID != v2 || !strings.Contains(doc, `"USD"`) {
				t.Fatalf("after v2 was registered: id %d (want %d), %s", gotID, v2, doc)
			}
		})
	}
}

// TestSchemaRegistryDown: with the registry down, an event whose schema
// is not cached waits: the session retries, nothing past it is sent or
// confirmed, and nothing is dead-lettered, even once
// schema_registry.missing_subject_after has passed (it is for a registry
// that answers it does not know the subject, not for one that does not
// answer). Once the registry is back, it and the events behind it are
// delivered, in order.
func TestSchemaRegistryDown(t *testing.T) {
	e, reg := fakeSchemaEnv(t, outbox.SchemaAvro, "")
	e.cfg.SchemaRegistry.MissingAfter = time.Second
	for _, s := range []string{"order", "payment"} {
		if _, _, err := reg.RegisterSchema(e.kafka.Prefix+"outbox.event."+s+"-value", sr.Schema{Schema: orderAvro, Type: sr.TypeAvro}); err != nil {
			t.Fatal(err)
		}
	}
	r := e.start(t)
	conn := testenv.Connect(t, e.db)
	c := e.kafka.NewConsumer(t, e.kafka.AllTopics())
	insertEventTx(t, conn, "order", "o-1", "OrderPlaced", `'{"id": "o-1", "qty": 1}'`)
	c.WaitCount(t, time.Minute, 1)

	reg.Stop()
	before := testenv.CurrentWAL(t, e.db)
	_, xid := insertEventTx(t, conn, "payment", "p-1", "Paid", `'{"id": "p-1", "qty": 1}'`) // a subject not cached
	insertEventTx(t, conn, "order", "o-1", "OrderPlaced", `'{"id": "o-1", "qty": 2}'`)
	waiting := testenv.CommitLSN(t, e.db, xid, before)
	// The registry stays down until the session has failed the lookup
	// twice after missing_subject_after passed since the outage began: it
	// keeps retrying, however slowly a loaded machine lets it, and takes
	// no answer for a missing subject. Each look reads Kafka to its end:
	// what the pipeline sent is there.
	failed := func() float64 { return counterValue(r.p.Metrics().SchemaLookups.WithLabelValues("error")) }
	began, pastMissing := time.Now(), -1.0
	for pastMissing < 0 || failed() < pastMissing+2 {
		if pastMissing < 0 && time.Since(began) > e.cfg.SchemaRegistry.MissingAfter {
			pastMissing = failed()
		}
		if time.Since(began) > 2*time.Minute {
			t.Fatalf("%v failed lookups in 2 minutes; the session should keep retrying", failed())
		}
		c.Settle(t)
		if len(c.Records) != 1 {
			t.Fatalf("%d records while the registry is down, want only the first event's", len(c.Records))
		}
		if pos := testenv.SlotPosition(t, e.db, "outbox_cdc"); pos > waiting {
			t.Fatalf("slot confirmed %s, past the commit record of the event waiting for its schema (%s)", pos, waiting)
		}
		time.Sleep(250 * time.Millisecond) // the interval between looks, not synchronisation
	}

	reg.Start()
	c.WaitCount(t, time.Minute, 3)
	c.SettleConfirmed(t, time.Minute, e.db, "outbox_cdc")
	// In order per key: the order Kafka keeps (one key, one partition).
	seq := map[string][]string{}
	for _, rec := range c.Records {
		if strings.HasSuffix(rec.Topic, "dead-letters") {
			t.Fatalf("dead-lettered during the outage: %s", rec.Value)
		}
		_, doc := reg.Decode(t, rec)
		var v any
		if err := json.Unmarshal([]byte(doc), &v); err != nil {
			t.Fatal(err)
		}
		norm, _ := json.Marshal(v) // members sorted
		seq[string(rec.Key)] = append(seq[string(rec.Key)], string(norm))
	}
	want := map[string][]string{"o-1": {`{"id":"o-1","qty":1}`, `{"id":"o-1","qty":2}`}, "p-1": {`{"id":"p-1","qty":1}`}}
	if !reflect.DeepEqual(seq, want) {
		t.Fatalf("delivered %v, want %v", seq, want)
	}
	if r.p.DeadLettered.Load() != 0 {
		t.Fatal("an event was dead-lettered for the outage")
	}
}

// TestCheckSchemaSubjects: cdc check looks up the subjects it can name
// without an event (a literal topic, the topic strategy, and the key
// subject with schema.key), reports each one missing, and passes once
// they are registered; a registry it cannot reach is one line naming the
// URL. It registers nothing, even with auto_register.
func TestCheckSchemaSubjects(t *testing.T) {
	e, reg := schemaEnv(t, outbox.SchemaAvro, "")
	topic := e.kafka.Prefix + "orders"
	e.cfg.Tables[0].Topic = topic
	e.cfg.Tables[0].Schema.Key = true
	dynamic := *e.cfg.Tables[0]
	testenv.Exec(t, e.db, `CREATE TABLE outbox2 (LIKE outbox INCLUDING ALL)`)
	dynamic.Name = outbox.TableName{Schema: "public", Name: "outbox2"}
	dynamic.Topic = e.kafka.Prefix + "{aggregate_type}" // named per event: not checked
	e.cfg.Tables = append(e.cfg.Tables, &dynamic)
	check := func() []string {
		t.Helper()
		p, err := pipeline.New(e.cfg, hclog.NewNullLogger(), pipeline.Options{})
		if err != nil {
			t.Fatal(err)
		}
		_, err = p.Ops().Check(context.Background())
		if err == nil {
			return nil
		}
		var ce *setup.CheckError
		if !errors.As(err, &ce) {
			t.Fatalf("check: %v", err)
		}
		return ce.Problems
	}
	probs := check()
	if len(probs) != 2 || !strings.Contains(probs[0], `public.outbox: schema registry has no subject "`+topic+`-value"`) ||
		!strings.Contains(probs[1], `no subject "`+topic+`-key"`) {
		t.Fatalf("problems %q; want the value and key subjects missing", probs)
	}
	// A schema file that does not compile is a config error; one that
	// does, with auto_register, stands for the missing value subject.
	e.cfg.SchemaRegistry.AutoRegister = true
	e.cfg.Tables[0].Schema.File = filepath.Join(t.TempDir(), "order.avsc")
	if err := os.WriteFile(e.cfg.Tables[0].Schema.File, []byte(`{"type": "record"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := pipeline.New(e.cfg, hclog.NewNullLogger(), pipeline.Options{}); err == nil || !strings.Contains(err.Error(), "order.avsc does not compile as avro") {
		t.Fatalf("a schema file that does not compile: %v", err)
	}
	if err := os.WriteFile(e.cfg.Tables[0].Schema.File, []byte(orderAvro), 0o644); err != nil {
		t.Fatal(err)
	}
	if probs := check(); len(probs) != 1 || !strings.Contains(probs[0], `no subject "`+topic+`-key"`) {
		t.Fatalf("problems %q; want only the key subject, which auto_register does not fill", probs)
	}
	if reg.SubjectExists(topic + "-value") {
		t.Fatal("check registered a schema")
	}
	for _, s := range []sr.Schema{{Schema: orderAvro, Type: sr.TypeAvro}, {Schema: `"string"`, Type: sr.TypeAvro}} {
		subj := topic + "-value"
		if s.Schema == `"string"` {
			subj = topic + "-key"
		}
		if _, _, err := reg.RegisterSchema(subj, s); err != nil {
			t.Fatal(err)
		}
	}
	if probs := check(); probs != nil {
		t.Fatalf("with both subjects registered: %q", probs)
	}
	down := testregistry.NewFake(t)
	down.Stop()
	e.cfg.SchemaRegistry.URL = down.URL
	if probs := check(); len(probs) != 1 || !strings.Contains(probs[0], "schema registry "+down.URL+": dial tcp") || !strings.Contains(probs[0], "check schema_registry.url") {
		t.Fatalf("registry down: %q", probs)
	}
}

// TestReplayEncodesTheSame: a replay's events take the stream's path: they
// are encoded against the subject of their topic (before the replay's
// suffix), with the same schema id, and decode to the same payload.
func TestReplayEncodesTheSame(t *testing.T) {
	e, reg := schemaEnv(t, outbox.SchemaAvro, "")
	e.cfg.Replay.Window = time.Hour
	id, _, err := reg.RegisterSchema(e.kafka.Prefix+"outbox.event.order-value", sr.Schema{Type: sr.TypeAvro,
		Schema: `{"type":"record","name":"E","fields":[{"name":"k","type":"int"}]}`})
	if err != nil {
		t.Fatal(err)
	}
	e.start(t)
	c := e.kafka.NewConsumer(t, e.kafka.AllTopics())
	events := writeEvents(t, e, c, 3, "E")
	from := commitOf(c.Records, events[0])
	if _, err := e.newPipeline(t).Replay(context.Background(), replay.Request{Range: replay.Range{FromLSN: from}, TopicSuffix: ".replay"}, nil); err != nil {
		t.Fatal(err)
	}
	rc := e.kafka.NewConsumer(t, "^"+regexp.QuoteMeta(e.kafka.Prefix)+`.*\.replay$`)
	rc.WaitCount(t, time.Minute, 3)
	for _, rec := range append(c.Records, rc.Records...) {
		gotID, doc := reg.Decode(t, rec)
		if gotID != id {
			t.Fatalf("%s: schema id %d, want %d", rec.Topic, gotID, id)
		}
		sameJSON(t, doc, `{"k":1}`)
	}
}

// registryError is a real registry's error body (Confluent's API
// reference; Apicurio's ccompat/v7 answers the same shape).
func registryError(code int, msg string) string {
	return `{"error_code": ` + strconv.Itoa(code) + `, "message": "` + msg + `"}`
}

// TestRegistryConformance (issue 41): for each call the connector makes
// and each error a real registry (Confluent Schema Registry's API
// reference; Apicurio Registry's ccompat/v7) answers it with, what the
// connector does. A registry that is down or failing (5xx) is waited for,
// and the event goes once it answers; one that keeps saying the subject
// or version does not exist (40401-40403) makes the event invalid after
// schema_registry.missing_subject_after, and it is dead-lettered while the
// events after it go; one that refuses the credentials (401, 403) or the
// schema auto_register offers (422, 409) stops the connector, naming what
// to fix. Nothing is lost in any row.
func TestRegistryConformance(t *testing.T) {
	type behaviour int
	const (
		wait behaviour = iota
		deadLetter
		stop
	)
	for _, tc := range []struct {
		name     string
		method   string // the call answered: GET the subject's version, POST a new one
		status   int
		body     string
		register bool // auto_register with schema.file
		then     behaviour
		want     string // in the stop's error or the dead letter's reason
	}{
		{"subject not found", http.MethodGet, 404, registryError(40401, "Subject 'x' not found."), false, deadLetter, "no subject"},
		{"version not found", http.MethodGet, 404, registryError(40402, "Version 1 not found."), false, deadLetter, "no subject"},
		{"schema not found", http.MethodGet, 404, registryError(40403, "Schema not found"), false, deadLetter, "no subject"},
		{"unauthorized", http.MethodGet, 401, registryError(40101, "Unauthorized"), false, stop, "refuses the connector's credentials (HTTP 401"},
		{"forbidden", http.MethodGet, 403, registryError(40301, "User cannot access the resource."), false, stop, "refuses the connector's credentials (HTTP 403"},
		{"server error", http.MethodGet, 500, registryError(50001, "Error in the backend data store"), false, wait, ""},
		{"invalid schema on register", http.MethodPost, 422, registryError(42201, "Invalid schema"), true, stop, "refuses to register tables[].schema.file"},
		{"incompatible on register", http.MethodPost, 409, registryError(409, "Schema being registered is incompatible with an earlier schema"), true, stop, "is incompatible"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, reg := fakeSchemaEnv(t, outbox.SchemaAvro, "")
			e.cfg.SchemaRegistry.MissingAfter = 500 * time.Millisecond
			subject := e.kafka.Prefix + "outbox.event.order-value"
			if tc.register {
				file := filepath.Join(t.TempDir(), "order.avsc")
				os.WriteFile(file, []byte(orderAvro), 0o600)
				e.cfg.Tables[0].Schema.File = file
				e.cfg.Tables[0].Topic = e.kafka.Prefix + "outbox.event.order" // a fixed topic: auto_register refuses templates
				e.cfg.SchemaRegistry.AutoRegister = true
			} else if _, _, err := reg.RegisterSchema(subject, sr.Schema{Schema: orderAvro, Type: sr.TypeAvro}); err != nil {
				t.Fatal(err)
			}
			var failing atomic.Bool
			failing.Store(true)
			var mu sync.Mutex
			var failedAt []time.Time // when each failing answer was given
			reg.Answer(func(req *http.Request) (int, string, bool) {
				if failing.Load() && req.Method == tc.method && strings.Contains(req.URL.Path, "/subjects/"+subject) {
					mu.Lock()
					failedAt = append(failedAt, time.Now())
					mu.Unlock()
					return tc.status, tc.body, true
				}
				return 0, "", false
			})
			r := e.start(t)
			conn := testenv.Connect(t, e.db)
			first, _ := insertEventTx(t, conn, "order", "k-1", "Created", `'{"id": "o-1", "qty": 1}'`)
			c := e.kafka.NewConsumer(t, e.kafka.AllTopics())
			switch tc.then {
			case stop:
				err := waitFatal(t, r)
				if !fault.Permanent(err) || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("Run returned %v; want a stop saying %q", err, tc.want)
				}
				if !testenv.Pending(t, e.db, "outbox_cdc", "outbox_cdc", first) {
					t.Fatal("the slot went past the event the connector stopped on")
				}
			case deadLetter:
				second, _ := insertEventTx(t, conn, "order", "k-2", "Created", `'{"id": "o-2", "qty": 2}'`)
				c.WaitFor(t, time.Minute, "both events in the dead-letter topic", func(recs []*kgo.Record) bool {
					return len(deadLetters(recs, e.cfg.Tables[0].DeadLetterTopic, first)) == 1 && len(deadLetters(recs, e.cfg.Tables[0].DeadLetterTopic, second)) == 1
				})
				reason := testenv.Header(deadLetters(c.Records, e.cfg.Tables[0].DeadLetterTopic, first)[0], route.HeaderDeadLetterError)
				if !strings.Contains(reason, tc.want) || !strings.Contains(reason, "missing_subject_after") {
					t.Errorf("dead letter reason %q; want it to say %q and the bound", reason, tc.want)
				}
				// Registered now: the next event goes as it should.
				failing.Store(false)
				third, _ := insertEventTx(t, conn, "order", "k-3", "Created", `'{"id": "o-3", "qty": 3}'`)
				c.WaitFor(t, time.Minute, "the event after the subject exists", func(recs []*kgo.Record) bool {
					for _, rec := range byKey(recs, "k-3") {
						if rec.Topic != e.cfg.Tables[0].DeadLetterTopic && testenv.Header(rec, route.HeaderID) == third {
							return true
						}
					}
					return false
				})
			case wait:
				// A failing registry is waited for past missing_subject_after:
				// wait until it has failed the event's lookups for longer
				// than that, and been asked twice since. A connector that
				// took a failing registry for a missing subject would have
				// dead-lettered the event at the first of those looks, and
				// asked nothing more.
				testenv.Eventually(t, time.Minute, "two lookups failed past missing_subject_after", func() bool {
					mu.Lock()
					defer mu.Unlock()
					past := 0
					for _, at := range failedAt {
						if at.Sub(failedAt[0]) > e.cfg.SchemaRegistry.MissingAfter {
							past++
						}
					}
					return past >= 2
				})
				c.Settle(t)
				if n := ids(c.Records)[first]; n != 0 {
					t.Fatalf("the event went (%d records) while the registry failed", n)
				}
				failing.Store(false)
				c.WaitFor(t, time.Minute, "the event once the registry answers", func(recs []*kgo.Record) bool { return ids(recs)[first] == 1 })
				if dl := deadLetters(c.Records, e.cfg.Tables[0].DeadLetterTopic, first); len(dl) != 0 {
					t.Fatal("an event that waited for a failing registry was dead-lettered")
				}
			}
		})
	}
}

// TestAutoRegisterWithRowChosenSubjects: auto_register with a topic
// template a row fills would let whoever inserts rows create subjects at
// will: refused at start.
func TestAutoRegisterWithRowChosenSubjects(t *testing.T) {
	e, _ := schemaEnv(t, outbox.SchemaAvro, "")
	file := filepath.Join(t.TempDir(), "order.avsc")
	os.WriteFile(file, []byte(orderAvro), 0o600)
	e.cfg.Tables[0].Schema.File = file
	e.cfg.SchemaRegistry.AutoRegister = true
	_, err := pipeline.New(e.cfg, hclog.NewNullLogger(), pipeline.Options{})
	if err == nil || !strings.Contains(err.Error(), "create registry subjects at will") {
		t.Fatalf("pipeline.New: %v; want auto_register refused with a row-chosen topic", err)
	}
}

// TestRegistryWaitExactlyOnce (issue 41): in exactly-once mode a registry
// wait may not outlive the Kafka transaction: after half of
// transaction_timeout the session ends cleanly (its transaction aborted,
// nothing past the event confirmed) and the next one waits again; once the
// registry answers, a read_committed consumer sees each event once.
func TestRegistryWaitExactlyOnce(t *testing.T) {
	e, reg := fakeSchemaEnv(t, outbox.SchemaAvro, "")
	e.cfg.Delivery = config.DeliveryExactlyOnce
	e.cfg.ExactlyOnce.TransactionTimeout = 4 * time.Second // a registry wait ends the session after 2 s
	if _, _, err := reg.RegisterSchema(e.kafka.Prefix+"outbox.event.order-value", sr.Schema{Schema: orderAvro, Type: sr.TypeAvro}); err != nil {
		t.Fatal(err)
	}
	r := e.start(t)
	conn := testenv.Connect(t, e.db)
	c := e.kafka.NewCommittedConsumer(t, e.kafka.AllTopics())
	insertEventTx(t, conn, "order", "o-1", "OrderPlaced", `'{"id": "o-1", "qty": 1}'`)
	c.WaitCount(t, time.Minute, 1)
	reg.Stop()
	from := testenv.CurrentWAL(t, e.db)
	waiting, xid := insertEventTx(t, conn, "payment", "p-1", "Paid", `'{"id": "p-1", "qty": 1}'`) // a subject not cached
	before := testenv.CommitLSN(t, e.db, xid, from)
	testenv.Eventually(t, time.Minute, "sessions ended by the wait, and started again", func() bool { return counterValue(r.p.Metrics().Restarts) >= 2 })
	if pos := testenv.SlotPosition(t, e.db, "outbox_cdc"); pos > before {
		t.Fatalf("slot confirmed %s past the commit record of the waiting event (%s)", pos, before)
	}
	if _, _, err := reg.RegisterSchema(e.kafka.Prefix+"outbox.event.payment-value", sr.Schema{Schema: orderAvro, Type: sr.TypeAvro}); err != nil {
		t.Fatal(err)
	}
	reg.Start()
	after, _ := insertEventTx(t, conn, "order", "o-1", "OrderPlaced", `'{"id": "o-1", "qty": 2}'`)
	c.WaitFor(t, time.Minute, "the waiting event and the one after", func(recs []*kgo.Record) bool { return ids(recs)[waiting] == 1 && ids(recs)[after] == 1 })
	c.SettleConfirmed(t, time.Minute, e.db, "outbox_cdc")
	for id, n := range ids(c.Records) {
		if n != 1 {
			t.Errorf("event %s read %d times read_committed", id, n)
		}
	}
}

// TestRegistryWaitDuringFirstStartBackfill (issue 41): a first start's
// backfill waits for a registry that is down, before its stream starts,
// for longer than wal_sender_timeout: the replication connection, idle
// meanwhile, survives it, and every row goes once the registry answers.
func TestRegistryWaitDuringFirstStartBackfill(t *testing.T) {
	e, reg := fakeSchemaEnv(t, outbox.SchemaAvro, "")
	subject := e.kafka.Prefix + "outbox.event.order-value"
	e.cfg.Postgres.URL += "&options=-c%20wal_sender_timeout%3D2s"
	e.cfg.Tables[0].Backfill = &outbox.BackfillOptions{ChunkSize: 10}
	testenv.Exec(t, e.db, `INSERT INTO outbox (aggregatetype, aggregateid, type, payload)
		SELECT 'order', 'o-' || i, 'OrderPlaced', jsonb_build_object('id', 'o-' || i, 'qty', i) FROM generate_series(1, 30) i`)
	reg.Stop()
	r := e.launch(t, discard{})
	time.Sleep(5 * time.Second) // the outage: the fault, longer than wal_sender_timeout
	if _, _, err := reg.RegisterSchema(subject, sr.Schema{Schema: orderAvro, Type: sr.TypeAvro}); err != nil {
		t.Fatal(err)
	}
	reg.Start()
	testenv.Eventually(t, time.Minute, "the pipeline to stream", func() bool { return r.tracker.Load() != nil })
	c := e.kafka.NewConsumer(t, e.kafka.AllTopics())
	c.WaitCount(t, time.Minute, 30)
	c.SettleConfirmed(t, time.Minute, e.db, "outbox_cdc")
	if n := len(ids(c.Records)); n != 30 || len(c.Records) != 30 {
		t.Fatalf("%d records of %d rows; want each of the 30 once", len(c.Records), n)
	}
}
