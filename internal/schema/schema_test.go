package schema

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outboxcdc/cdc/internal/sink"

	"github.com/hashicorp/go-hclog"

	"github.com/linkedin/goavro/v2"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"
	"github.com/twmb/franz-go/pkg/sr/srfake"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/outboxcdc/cdc/internal/metrics"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/testenv"
	"github.com/outboxcdc/cdc/internal/testenv/testregistry"
)

const orderAvro = `{"type":"record","name":"Order","namespace":"shop","fields":[` +
	`{"name":"id","type":"string"},{"name":"qty","type":"int"},{"name":"note","type":["null","string"],"default":null}]}`

// orderAvroV2 adds a field with a default: a backward-compatible change.
const orderAvroV2 = `{"type":"record","name":"Order","namespace":"shop","fields":[` +
	`{"name":"id","type":"string"},{"name":"qty","type":"int"},{"name":"note","type":["null","string"],"default":null},` +
	`{"name":"currency","type":"string","default":"EUR"}]}`

func table(t *testing.T, s outbox.Schema) *outbox.Source {
	t.Helper()
	tb := &outbox.Source{Name: outbox.TableName{Schema: "public", Name: "outbox"}, Columns: outbox.DefaultColumns, Schema: s}
	if err := tb.Validate(); err != nil {
		t.Fatal(err)
	}
	return tb
}

func event(tb *outbox.Source, typ, payload string) *outbox.Event {
	ev := &outbox.Event{Source: tb}
	ev.Fields[outbox.FieldID] = outbox.Value{B: []byte("e-1")}
	ev.Fields[outbox.FieldEventType] = outbox.Value{B: []byte(typ)}
	ev.Fields[outbox.FieldPayload] = outbox.Value{B: []byte(payload), Kind: outbox.KindJSON}
	return ev
}

func newRegistry(t *testing.T, url string, m *metrics.Metrics, mod func(*Config)) *Registry {
	t.Helper()
	cfg := Config{URL: url}
	if mod != nil {
		mod(&cfg)
	}
	if err := cfg.Validate(true); err != nil {
		t.Fatal(err)
	}
	r, err := New(cfg, m, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// apply is Registry.Apply with one attempt per lookup: a lookup's error
// is returned instead of retried.
func apply(r *Registry, rec *kgo.Record, ev *outbox.Event) error {
	for range 4 {
		err := r.Encode(rec, ev)
		var m *Miss
		if !errors.As(err, &m) {
			return err
		}
		if err := r.Resolve(context.Background(), m); err != nil {
			return err
		}
	}
	return r.Encode(rec, ev)
}

// TestApplyWaitsForTheRegistry: Apply, as the session calls it, retries a
// registry that is down until it answers, through the blocking path it is
// given, and gives up only when its context ends.
func TestApplyWaitsForTheRegistry(t *testing.T) {
	reg := testregistry.NewFake(t)
	if _, _, err := reg.RegisterSchema("orders-value", sr.Schema{Schema: orderAvro, Type: sr.TypeAvro}); err != nil {
		t.Fatal(err)
	}
	reg.Stop()
	m := metrics.New("t")
	r := newRegistry(t, reg.URL, m, nil)
	tb := table(t, outbox.Schema{Format: outbox.SchemaAvro})
	payload := `{"id":"o-1","qty":1}`
	rec := record("orders", "o-1", payload)
	blocking := 0
	done := make(chan error, 1)
	go func() {
		done <- r.Apply(context.Background(), rec, event(tb, "OrderPlaced", payload), func(f func() error) error { blocking++; return f() })
	}()
	testenv.Eventually(t, time.Minute, "two failed lookups", func() bool { return testenv.Counter(t, m.Registry, "cdc_schema_lookups_total", "result", "error") >= 2 })
	select {
	case err := <-done:
		t.Fatalf("Apply returned %v while the registry is down", err)
	default:
	}
	reg.Start()
	select {
	case err := <-done:
		if err != nil || blocking != 1 {
			t.Fatalf("Apply: %v after %d blocking calls, want nil after 1", err, blocking)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Apply did not return once the registry was back")
	}
	if id, got := decodeAvro(t, reg, rec.Value); id != 1 || got["id"] != "o-1" {
		t.Fatalf("decoded %v with id %d", got, id)
	}

	reg.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		done <- newRegistry(t, reg.URL, nil, nil).Apply(ctx, record("orders", "o-1", payload), event(tb, "OrderPlaced", payload), func(f func() error) error { return f() })
	}()
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Apply after cancel: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Apply did not end with its context")
	}
}

// framed is Confluent's prefix for id: a zero byte and the id, 4 bytes
// big-endian. A real registry's ids are past 255 soon enough.
func framed(id int) []byte { return binary.BigEndian.AppendUint32([]byte{0}, uint32(id)) }

func record(topic, key, value string) *kgo.Record {
	return &kgo.Record{Topic: topic, Key: []byte(key), Value: []byte(value)}
}

// decodeAvro reads a Confluent-framed Avro value back, as a
// registry-aware deserialiser does: the id from the prefix, the schema
// from the registry by id.
func decodeAvro(t *testing.T, reg *testregistry.Registry, value []byte) (int, map[string]any) {
	t.Helper()
	var h sr.ConfluentHeader
	id, rest, err := h.DecodeID(value)
	if err != nil {
		t.Fatalf("value %x: %v", value, err)
	}
	cl, _ := sr.NewClient(sr.URLs(reg.URL))
	s, err := cl.SchemaByID(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	c, err := goavro.NewCodec(s.Schema)
	if err != nil {
		t.Fatal(err)
	}
	native, tail, err := c.NativeFromBinary(rest)
	if err != nil || len(tail) != 0 {
		t.Fatalf("decode avro %x: %v (%d bytes left)", rest, err, len(tail))
	}
	return id, native.(map[string]any)
}

// TestAvro: a JSON payload is encoded with the subject's latest Avro
// schema and framed with its id; the registry's deserialiser reads back
// what the application wrote. Plain JSON and Avro's JSON encoding of a
// union both work.
func TestAvro(t *testing.T) {
	reg := testregistry.New(t)
	orders := reg.Prefix + "orders"
	v1, _, err := reg.RegisterSchema(orders+"-value", sr.Schema{Schema: orderAvro, Type: sr.TypeAvro})
	if err != nil {
		t.Fatal(err)
	}
	m := metrics.New("t")
	r := newRegistry(t, reg.URL, m, nil)
	tb := table(t, outbox.Schema{Format: outbox.SchemaAvro})
	for _, payload := range []string{`{"id":"o-1","qty":2,"note":"gift"}`, `{"id":"o-1","qty":2,"note":{"string":"gift"}}`} {
		rec := record(orders, "o-1", payload)
		if err := apply(r, rec, event(tb, "OrderPlaced", payload)); err != nil {
			t.Fatal(err)
		}
		id, got := decodeAvro(t, reg, rec.Value)
		if id != v1 || got["id"] != "o-1" || got["qty"] != int32(2) || got["note"].(map[string]any)["string"] != "gift" {
			t.Fatalf("id %d (want %d), decoded %v", id, v1, got)
		}
		if string(rec.Key) != "o-1" {
			t.Fatalf("key %q: without schema.key it stays text", rec.Key)
		}
	}
	if got := testenv.Counter(t, m.Registry, "cdc_schema_lookups_total", "result", "fetched"); got != 1 {
		t.Fatalf("fetched %v times, want 1 (then cached)", got)
	}
	if got := testenv.Counter(t, m.Registry, "cdc_schema_lookups_total", "result", "cached"); got != 2 {
		t.Fatalf("cached lookups %v, want 2", got)
	}
}

// TestInvalidIsAnEventError: a payload that does not match is an
// *outbox.EventError (dead-lettered or stopping, per on_invalid) that says
// which subject and version it failed, once the latest was re-read.
func TestInvalidIsAnEventError(t *testing.T) {
	reg := testregistry.New(t)
	orders := reg.Prefix + "orders"
	if _, _, err := reg.RegisterSchema(orders+"-value", sr.Schema{Schema: orderAvro, Type: sr.TypeAvro}); err != nil {
		t.Fatal(err)
	}
	m := metrics.New("t")
	r := newRegistry(t, reg.URL, m, nil)
	tb := table(t, outbox.Schema{Format: outbox.SchemaAvro})
	for _, payload := range []string{`{"id":"o-1","qty":"two"}`, `{"id":"o-1"}`, `not json`, `{"id":"o-1","qty":2,"unknown":1}`} {
		rec := record(orders, "o-1", payload)
		err := apply(r, rec, event(tb, "OrderPlaced", payload))
		var ee *outbox.EventError
		if !errors.As(err, &ee) || !strings.Contains(err.Error(), `schema subject "`+orders+`-value" version 1`) || strings.Contains(err.Error(), "\n") {
			t.Fatalf("%s: got %v, want a one-line EventError naming the subject", payload, err)
		}
		if string(rec.Value) != payload {
			t.Fatalf("the record's value changed to %q", rec.Value)
		}
	}
	if got := testenv.Counter(t, m.Registry, "cdc_schema_invalid_total", "source", "public.outbox"); got != 4 {
		t.Fatalf("cdc_schema_invalid_total = %v, want 4", got)
	}
}

// TestSchemaEvolvedWhileStreaming: an event that does not fit the cached
// latest schema makes the connector read the latest again before judging
// it; a newer version it fits is used, with its id.
func TestSchemaEvolvedWhileStreaming(t *testing.T) {
	reg := testregistry.New(t)
	orders := reg.Prefix + "orders"
	v1, _, err := reg.RegisterSchema(orders+"-value", sr.Schema{Schema: orderAvro, Type: sr.TypeAvro})
	if err != nil {
		t.Fatal(err)
	}
	r := newRegistry(t, reg.URL, nil, nil)
	tb := table(t, outbox.Schema{Format: outbox.SchemaAvro})
	rec := record(orders, "o-1", `{"id":"o-1","qty":1}`)
	if err := apply(r, rec, event(tb, "OrderPlaced", `{"id":"o-1","qty":1}`)); err != nil {
		t.Fatal(err)
	}
	v2, _, err := reg.RegisterSchema(orders+"-value", sr.Schema{Schema: orderAvroV2, Type: sr.TypeAvro})
	if err != nil || v2 == v1 {
		t.Fatalf("register v2: id %d, %v", v2, err)
	}
	payload := `{"id":"o-2","qty":1,"currency":"USD"}`
	rec = record(orders, "o-2", payload)
	if err := apply(r, rec, event(tb, "OrderPlaced", payload)); err != nil {
		t.Fatal(err)
	}
	if id, got := decodeAvro(t, reg, rec.Value); id != v2 || got["currency"] != "USD" {
		t.Fatalf("id %d (want v2's %d), decoded %v", id, v2, got)
	}
	// A pinned version is never re-read: the event is invalid against it.
	pinned := table(t, outbox.Schema{Format: outbox.SchemaAvro, Version: 1})
	rec = record(orders, "o-2", payload)
	if err := apply(r, rec, event(pinned, "OrderPlaced", payload)); !errors.As(err, new(*outbox.EventError)) {
		t.Fatalf("pinned to version 1: %v, want an EventError", err)
	}
}

// TestRegistryDownIsNotAnEventError: a registry that cannot answer, or
// has no schema for the subject, is a LookupError, which the session
// retries; nothing is dead-lettered for it, and no secret is in the text.
func TestRegistryDownIsNotAnEventError(t *testing.T) {
	reg := testregistry.NewFake(t, srfake.WithAuth("Basic "+base64.StdEncoding.EncodeToString([]byte("cdc:s3cret-pass"))))
	reg.Stop()
	pw := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pw, []byte("s3cret-pass\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	m := metrics.New("t")
	r := newRegistry(t, reg.URL, m, func(c *Config) { c.Username, c.PasswordFile, c.Timeout = "cdc", pw, 2*time.Second })
	tb := table(t, outbox.Schema{Format: outbox.SchemaAvro})
	payload := `{"id":"o-1","qty":1}`
	check := func(want string) {
		t.Helper()
		err := apply(r, record("orders", "o-1", payload), event(tb, "OrderPlaced", payload))
		var le *LookupError
		if !errors.As(err, &le) || errors.As(err, new(*outbox.EventError)) || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "s3cret") {
			t.Fatalf("got %v, want a LookupError saying %q", err, want)
		}
	}
	// Refused, or reset where another test's listener took the port
	// meanwhile (seen in CI): either is the dial's error.
	check("dial tcp")
	reg.Start()
	check(`has no subject "orders-value"`)
	if _, _, err := reg.RegisterSchema("orders-value", sr.Schema{Schema: orderAvro, Type: sr.TypeAvro}); err != nil {
		t.Fatal(err)
	}
	if err := apply(r, record("orders", "o-1", payload), event(tb, "OrderPlaced", payload)); err != nil {
		t.Fatalf("with the registry back and the subject registered: %v", err)
	}
	if testenv.Counter(t, m.Registry, "cdc_schema_lookups_total", "result", "error") != 1 || testenv.Counter(t, m.Registry, "cdc_schema_lookups_total", "result", "not_found") != 1 {
		t.Fatal("the failed lookups were not counted by result")
	}
	// A wrong password is refused, and the error does not show it.
	if err := os.WriteFile(pw, []byte("wrong-pass"), 0o600); err != nil {
		t.Fatal(err)
	}
	r2 := newRegistry(t, reg.URL, nil, func(c *Config) { c.Username, c.PasswordFile = "cdc", pw })
	err := apply(r2, record("orders", "o-1", payload), event(tb, "OrderPlaced", payload))
	// 401 and 403 are refusals, which stop the connector with the reason
	// (waiting would not fix them), not lookups to retry.
	if !errors.As(err, new(*RefusedError)) || strings.Contains(err.Error(), "wrong-pass") || !strings.Contains(err.Error(), "not authorized") {
		t.Fatalf("wrong password: %v", err)
	}
}

// TestJSONSchema: the payload is checked and sent as written, the id in
// the 5-byte prefix or in a schema_id header.
func TestJSONSchema(t *testing.T) {
	reg := testregistry.New(t)
	orders := reg.Prefix + "orders"
	id, _, err := reg.RegisterSchema(orders+"-value", sr.Schema{Type: sr.TypeJSON, Schema: `{"type":"object","required":["id","qty"],"properties":{"id":{"type":"string"},"qty":{"type":"integer","minimum":1}}}`})
	if err != nil {
		t.Fatal(err)
	}
	r := newRegistry(t, reg.URL, nil, nil)
	payload := `{"id":"o-1","qty":2}`
	prefix := table(t, outbox.Schema{Format: outbox.SchemaJSONSchema})
	rec := record(orders, "o-1", payload)
	if err := apply(r, rec, event(prefix, "OrderPlaced", payload)); err != nil {
		t.Fatal(err)
	}
	if want := append(framed(id), payload...); !bytes.Equal(rec.Value, want) {
		t.Fatalf("value %q, want %q", rec.Value, want)
	}
	header := table(t, outbox.Schema{Format: outbox.SchemaJSONSchema, IDIn: outbox.IDInHeader})
	rec = record(orders, "o-1", payload)
	if err := apply(r, rec, event(header, "OrderPlaced", payload)); err != nil {
		t.Fatal(err)
	}
	if string(rec.Value) != payload || len(rec.Headers) != 1 || rec.Headers[0].Key != HeaderSchemaID || string(rec.Headers[0].Value) != strconv.Itoa(id) {
		t.Fatalf("value %q headers %v: want the payload as written and schema_id: %d", rec.Value, rec.Headers, id)
	}
	bad := `{"id":"o-1","qty":0}`
	if err := apply(r, record(orders, "o-1", bad), event(header, "OrderPlaced", bad)); !errors.As(err, new(*outbox.EventError)) || !strings.Contains(err.Error(), "minimum") {
		t.Fatalf("qty 0: %v, want an EventError about the minimum", err)
	}
	// With schema.key, the key is checked as a JSON string under
	// orders-key: in the header mode it stays as written, with its id in
	// key_schema_id.
	keyID, _, err := reg.RegisterSchema(orders+"-key", sr.Schema{Type: sr.TypeJSON, Schema: `{"type":"string","pattern":"^o-"}`})
	if err != nil {
		t.Fatal(err)
	}
	keyed := table(t, outbox.Schema{Format: outbox.SchemaJSONSchema, IDIn: outbox.IDInHeader, Key: true})
	rec = record(orders, "o-1", payload)
	if err := apply(r, rec, event(keyed, "OrderPlaced", payload)); err != nil {
		t.Fatal(err)
	}
	if string(rec.Key) != "o-1" || testenv.Header(rec, HeaderKeySchemaID) != strconv.Itoa(keyID) || testenv.Header(rec, HeaderSchemaID) != strconv.Itoa(id) {
		t.Fatalf("key %q headers %v: want the key as written, key_schema_id %d and schema_id %d", rec.Key, rec.Headers, keyID, id)
	}
	if err := apply(r, record(orders, "x-1", payload), event(keyed, "OrderPlaced", payload)); !errors.As(err, new(*outbox.EventError)) || !strings.Contains(err.Error(), "its key does not match") {
		t.Fatalf("key x-1: %v, want an EventError about the key", err)
	}
}

// TestProtobuf: the JSON payload becomes the named message, framed with
// its index path, and decodes back with the registered descriptor.
func TestProtobuf(t *testing.T) {
	reg := testregistry.New(t)
	proto3 := `syntax = "proto3"; package shop; message Money { int64 cents = 1; } message Order { string id = 1; int32 qty = 2; Money total = 3; }`
	orders := reg.Prefix + "orders"
	if _, _, err := reg.RegisterSchema(orders+"-value", sr.Schema{Type: sr.TypeProtobuf, Schema: proto3}); err != nil {
		t.Fatal(err)
	}
	r := newRegistry(t, reg.URL, nil, nil)
	tb := table(t, outbox.Schema{Format: outbox.SchemaProtobuf, Message: "shop.Order"})
	payload := `{"id":"o-1","qty":2,"total":{"cents":"1250"}}`
	rec := record(orders, "o-1", payload)
	if err := apply(r, rec, event(tb, "OrderPlaced", payload)); err != nil {
		t.Fatal(err)
	}
	var h sr.ConfluentHeader
	_, rest, err := h.DecodeID(rec.Value)
	if err != nil {
		t.Fatal(err)
	}
	idx, rest, err := h.DecodeIndex(rest, 8)
	if err != nil || len(idx) != 1 || idx[0] != 1 {
		t.Fatalf("message index %v (%v), want [1]: Order is the file's second message", idx, err)
	}
	c, err := newProtobuf(proto3, "shop.Order")
	if err != nil {
		t.Fatal(err)
	}
	msg := dynamicpb.NewMessage(c.md)
	if err := proto.Unmarshal(rest, msg); err != nil {
		t.Fatal(err)
	}
	fields := c.md.Fields()
	total := msg.Get(fields.ByName("total")).Message()
	if msg.Get(fields.ByName("id")).String() != "o-1" || msg.Get(fields.ByName("qty")).Int() != 2 ||
		total.Get(total.Descriptor().Fields().ByName("cents")).Int() != 1250 {
		t.Fatalf("decoded %v", msg)
	}
	bad := `{"id":"o-1","qty":"many"}`
	if err := apply(r, record(orders, "o-1", bad), event(tb, "OrderPlaced", bad)); !errors.As(err, new(*outbox.EventError)) {
		t.Fatalf("qty many: %v, want an EventError", err)
	}
}

// TestSubjectsKeysAndAutoRegister: the record strategies name subjects
// after the event type; schema.key encodes the key under <topic>-key; with
// auto_register, schema.file is registered under a subject that has none.
func TestSubjectsKeysAndAutoRegister(t *testing.T) {
	reg := testregistry.New(t)
	// The record strategies name the subject after the event type alone
	// (or with the topic): both carry the test's prefix.
	orders, placed := reg.Prefix+"orders", reg.Prefix+"OrderPlaced"
	for _, s := range []string{placed, orders + "-" + placed, orders + "-value"} {
		if _, _, err := reg.RegisterSchema(s, sr.Schema{Schema: orderAvro, Type: sr.TypeAvro}); err != nil {
			t.Fatal(err)
		}
	}
	keyID, _, err := reg.RegisterSchema(orders+"-key", sr.Schema{Schema: `"string"`, Type: sr.TypeAvro})
	if err != nil {
		t.Fatal(err)
	}
	r := newRegistry(t, reg.URL, nil, nil)
	payload := `{"id":"o-1","qty":2}`
	for _, strategy := range []string{outbox.SubjectRecord, outbox.SubjectTopicRecord} {
		rec := record(orders, "o-1", payload)
		if err := apply(r, rec, event(table(t, outbox.Schema{Format: outbox.SchemaAvro, Subject: strategy}), placed, payload)); err != nil {
			t.Fatalf("%s: %v", strategy, err)
		}
		if err := apply(r, record(orders, "o-1", payload), event(table(t, outbox.Schema{Format: outbox.SchemaAvro, Subject: strategy}), reg.Prefix+"Other", payload)); !errors.As(err, new(*LookupError)) {
			t.Fatalf("%s, event type Other: %v, want a LookupError (no such subject)", strategy, err)
		}
	}
	rec := record(orders, "o-1", payload)
	if err := apply(r, rec, event(table(t, outbox.Schema{Format: outbox.SchemaAvro, Key: true}), placed, payload)); err != nil {
		t.Fatal(err)
	}
	if want := append(framed(keyID), 6, 'o', '-', '1'); !bytes.Equal(rec.Key, want) {
		t.Fatalf("key %x, want %x (framed Avro string)", rec.Key, want)
	}

	file := filepath.Join(t.TempDir(), "order.avsc")
	if err := os.WriteFile(file, []byte(orderAvro), 0o644); err != nil {
		t.Fatal(err)
	}
	tb := table(t, outbox.Schema{Format: outbox.SchemaAvro, File: file})
	off := newRegistry(t, reg.URL, nil, nil)
	payments := reg.Prefix + "payments"
	if err := apply(off, record(payments, "p-1", payload), event(tb, "Paid", payload)); !errors.As(err, new(*LookupError)) {
		t.Fatalf("auto_register off: %v, want a LookupError", err)
	}
	m := metrics.New("t")
	on := newRegistry(t, reg.URL, m, func(c *Config) { c.AutoRegister = true })
	rec = record(payments, "p-1", payload)
	if err := apply(on, rec, event(tb, "Paid", payload)); err != nil {
		t.Fatal(err)
	}
	if _, ok := reg.GetSchema(payments+"-value", 1); !ok || testenv.Counter(t, m.Registry, "cdc_schema_lookups_total", "result", "registered") != 1 {
		t.Fatal("schema.file was not registered under payments-value")
	}
	if id, got := decodeAvro(t, reg, rec.Value); got["id"] != "o-1" || id == 0 {
		t.Fatalf("decoded %v with id %d", got, id)
	}
}

// TestRegistryOverTLS: a registry that serves HTTPS and requires a client
// certificate (mTLS) is reached with schema_registry.tls; without the CA,
// or without the client certificate, the lookup fails with one line that
// says so, and it is a LookupError (waited for), not an invalid event.
func TestRegistryOverTLS(t *testing.T) {
	certs := testenv.NewCerts(t)
	server := certs.ServerTLS(t)
	pool := x509.NewCertPool()
	ca, err := os.ReadFile(certs.CAFile)
	if err != nil || !pool.AppendCertsFromPEM(ca) {
		t.Fatalf("CA: %v", err)
	}
	server.ClientAuth, server.ClientCAs = tls.RequireAndVerifyClientCert, pool
	reg := testregistry.NewFakeTLS(t, server)
	if _, _, err := reg.RegisterSchema("orders-value", sr.Schema{Schema: orderAvro, Type: sr.TypeAvro}); err != nil {
		t.Fatal(err)
	}
	tb := table(t, outbox.Schema{Format: outbox.SchemaAvro})
	payload := `{"id":"o-1","qty":1}`
	for _, tc := range []struct {
		name string
		tls  sink.TLSConfig
		want string // "" for success
	}{
		{"mTLS", sink.TLSConfig{CAFile: certs.CAFile, CertFile: certs.ClientCert, KeyFile: certs.ClientKey}, ""},
		{"no CA", sink.TLSConfig{CertFile: certs.ClientCert, KeyFile: certs.ClientKey}, "certificate signed by unknown authority"},
		{"no client certificate", sink.TLSConfig{CAFile: certs.CAFile}, "certificate required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRegistry(t, reg.URL, nil, func(c *Config) { c.TLS = tc.tls })
			rec := record("orders", "o-1", payload)
			err := apply(r, rec, event(tb, "OrderPlaced", payload))
			switch {
			case tc.want == "" && err != nil:
				t.Fatal(err)
			case tc.want == "":
				var h sr.ConfluentHeader
				_, rest, err := h.DecodeID(rec.Value)
				c, _ := goavro.NewCodec(orderAvro)
				if native, _, derr := c.NativeFromBinary(rest); err != nil || derr != nil || native.(map[string]any)["id"] != "o-1" {
					t.Fatalf("value %x: %v %v", rec.Value, err, derr)
				}
			case !errors.As(err, new(*LookupError)) || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n"):
				t.Fatalf("got %v; want a one-line LookupError saying %q", err, tc.want)
			}
		})
	}
}

// TestCacheIsBounded: a source's subjects come from its rows; past
// maxCachedSubjects its cache starts over (and is filled again from the
// registry) instead of growing.
func TestCacheIsBounded(t *testing.T) {
	reg := testregistry.New(t)
	a, b := reg.Prefix+"A", reg.Prefix+"B"
	for _, s := range []string{a, b} {
		if _, _, err := reg.RegisterSchema(s, sr.Schema{Schema: orderAvro, Type: sr.TypeAvro}); err != nil {
			t.Fatal(err)
		}
	}
	m := metrics.New("t")
	r := newRegistry(t, reg.URL, m, nil)
	tb := table(t, outbox.Schema{Format: outbox.SchemaAvro, Subject: outbox.SubjectRecord})
	payload := `{"id":"o-1","qty":1}`
	if err := apply(r, record("orders", "o-1", payload), event(tb, a, payload)); err != nil {
		t.Fatal(err)
	}
	r.sources[tb].entries = maxCachedSubjects
	if err := apply(r, record("orders", "o-1", payload), event(tb, b, payload)); err != nil {
		t.Fatal(err)
	}
	if c := r.sources[tb]; c.entries != 1 || c.value[""][a] != nil || c.value[""][b] == nil {
		t.Fatalf("after the bound: %d entries, A cached %v; want only B", c.entries, c.value[""][a] != nil)
	}
	if err := apply(r, record("orders", "o-1", payload), event(tb, a, payload)); err != nil {
		t.Fatal(err)
	}
	if got := testenv.Counter(t, m.Registry, "cdc_schema_lookups_total", "result", "fetched"); got != 3 {
		t.Fatalf("fetched %v times, want 3: A, B, and A again after the cache started over", got)
	}
}

// TestWeaknesses: credentials over http:// are named for the start-up log.
func TestWeaknesses(t *testing.T) {
	for _, tt := range []struct {
		cfg  Config
		weak bool
	}{
		{Config{URL: "http://r:8081"}, false},
		{Config{URL: "http://r:8081", Username: "u", Password: "p"}, true},
		{Config{URL: "http://r:8081", TokenFile: "/t"}, true},
		{Config{URL: "https://r:8081", Username: "u", Password: "p"}, false},
	} {
		if got := len(tt.cfg.Weaknesses()) > 0; got != tt.weak {
			t.Errorf("%+v: weak %v, want %v", tt.cfg, got, tt.weak)
		}
	}
}

// TestJSONSchemaLoadsNoFile (issue 37): a schema in the registry that
// refers to a local file is refused, and the file is never read.
func TestJSONSchemaLoadsNoFile(t *testing.T) {
	dir := t.TempDir()
	secret := filepath.Join(dir, "secret.json")
	if err := os.WriteFile(secret, []byte(`{"type": "string"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := newJSONSchema(`{"$ref": "file://` + secret + `"}`)
	if err == nil || !strings.Contains(err.Error(), "loads no schema from outside the registry") {
		t.Fatalf("a schema referring to a file: %v; want it refused", err)
	}
}
