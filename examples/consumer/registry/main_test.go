package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/outboxcdc/cdc/internal/config"
	"github.com/outboxcdc/cdc/internal/delivery"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/pipeline"
	"github.com/outboxcdc/cdc/internal/postgres"
	"github.com/outboxcdc/cdc/internal/schema"
	"github.com/outboxcdc/cdc/internal/sink"
	"github.com/outboxcdc/cdc/internal/testenv"
	"github.com/outboxcdc/cdc/internal/testenv/testregistry"
)

var pg *testenv.Postgres

func TestMain(m *testing.M) { testenv.Main(m, &pg) }

// TestDecodesWhatTheConnectorEncodes: the connector encodes one table's
// payloads as Avro and another's as protobuf; this consumer prints each
// record's JSON back, read through the registry by the id it carries.
func TestDecodesWhatTheConnectorEncodes(t *testing.T) {
	p := testenv.Require(t, pg)
	db := p.NewDatabase(t)
	testenv.Exec(t, db, `CREATE TABLE outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregatetype text NOT NULL,
		aggregateid text NOT NULL, type text NOT NULL, payload jsonb)`, `CREATE TABLE payments (LIKE outbox INCLUDING ALL)`)
	k := testenv.NewKafka(t)
	reg := testregistry.New(t)
	ids := map[string]int{}
	for _, r := range []struct {
		subject string
		schema  sr.Schema
	}{
		{k.Prefix + "orders-value", sr.Schema{Type: sr.TypeAvro, Schema: `{"type":"record","name":"Order","fields":[{"name":"id","type":"string"},{"name":"qty","type":"int"}]}`}},
		{k.Prefix + "payments-value", sr.Schema{Type: sr.TypeProtobuf, Schema: `syntax = "proto3"; message Payment { string id = 1; int64 cents = 2; }`}},
	} {
		id, _, err := reg.RegisterSchema(r.subject, r.schema)
		if err != nil {
			t.Fatal(err)
		}
		ids[r.subject] = id
	}
	cfg := config.Config{
		Postgres: postgres.Config{URL: db, StatusInterval: 50 * time.Millisecond},
		Kafka:    sink.Config{Brokers: k.Brokers},
		Tables: []*outbox.Source{
			{Name: outbox.TableName{Schema: "public", Name: "outbox"}, Columns: outbox.DefaultColumns, Topic: k.Prefix + "orders",
				Schema: outbox.Schema{Format: outbox.SchemaAvro}},
			{Name: outbox.TableName{Schema: "public", Name: "payments"}, Columns: outbox.DefaultColumns, Topic: k.Prefix + "payments",
				Schema: outbox.Schema{Format: outbox.SchemaProtobuf}},
		},
		SchemaRegistry: schema.Config{URL: reg.URL},
		Checkpoint:     config.CheckpointConfig{Topic: k.CheckpointTopic()},
	}
	streaming := make(chan struct{}, 1)
	conn, err := pipeline.New(cfg, hclog.New(&hclog.LoggerOptions{Level: hclog.Warn}), pipeline.Options{OnSession: func(*delivery.Tracker) {
		select {
		case streaming <- struct{}{}:
		default:
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- conn.Run(ctx) }()
	select {
	case <-streaming:
	case err := <-done:
		t.Fatalf("connector stopped: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the connector did not start streaming")
	}
	testenv.Exec(t, db,
		`INSERT INTO outbox (aggregatetype, aggregateid, type, payload) VALUES ('order', 'o-1', 'OrderPlaced', '{"id": "o-1", "qty": 3}')`,
		`INSERT INTO payments (aggregatetype, aggregateid, type, payload) VALUES ('payment', 'p-1', 'Paid', '{"id": "p-1", "cents": "1250"}')`)

	var out bytes.Buffer
	rctx, rcancel := context.WithTimeout(ctx, time.Minute)
	defer rcancel()
	if err := run(rctx, &out, strings.Join(k.Brokers, ","), reg.URL, "^"+regexp.QuoteMeta(k.Prefix)+"(orders|payments)$", 2); err != nil {
		t.Fatal(err)
	}
	// protojson's spacing varies by design: compare the JSON, not its text.
	want := map[string]string{
		fmt.Sprintf("%sorders o-1 %d", k.Prefix, ids[k.Prefix+"orders-value"]):     `{"id":"o-1","qty":3}`,
		fmt.Sprintf("%spayments p-1 %d", k.Prefix, ids[k.Prefix+"payments-value"]): `{"id":"p-1","cents":"1250"}`,
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != len(want) {
		t.Fatalf("printed %q; want %d lines", out.String(), len(want))
	}
	for _, l := range lines {
		f := strings.SplitN(l, " ", 4)
		if len(f) != 4 {
			t.Fatalf("line %q: want topic, key, id and JSON", l)
		}
		doc, ok := want[strings.Join(f[:3], " ")]
		var got, exp any
		if !ok || json.Unmarshal([]byte(f[3]), &got) != nil || json.Unmarshal([]byte(doc), &exp) != nil || !reflect.DeepEqual(got, exp) {
			t.Fatalf("line %q; want one of %v", l, want)
		}
	}
}
