package schema

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/testenv/testregistry"
)

// BenchmarkEncode is the per-event cost of each format on the
// benchmarks' payload ({"i": n, "pad": 200 bytes}), the schema cached.
func BenchmarkEncode(b *testing.B) {
	payload := []byte(`{"i": 123456, "pad": "` + string(make200()) + `"}`)
	for _, tc := range []struct {
		format, schema string
		typ            sr.SchemaType
	}{
		{outbox.SchemaAvro, `{"type":"record","name":"OrderCreated","fields":[{"name":"i","type":"long"},{"name":"pad","type":"string"}]}`, sr.TypeAvro},
		{outbox.SchemaJSONSchema, `{"type":"object","required":["i","pad"],"properties":{"i":{"type":"integer"},"pad":{"type":"string"}}}`, sr.TypeJSON},
		{outbox.SchemaProtobuf, `syntax = "proto3"; message OrderCreated { int64 i = 1; string pad = 2; }`, sr.TypeProtobuf},
	} {
		b.Run(tc.format, func(b *testing.B) {
			reg := testregistry.NewFake(b)
			if _, _, err := reg.RegisterSchema("orders-value", sr.Schema{Schema: tc.schema, Type: tc.typ}); err != nil {
				b.Fatal(err)
			}
			r := newRegistryB(b, reg.URL)
			tb := &outbox.Source{Name: outbox.TableName{Schema: "public", Name: "outbox"}, Columns: outbox.DefaultColumns, Schema: outbox.Schema{Format: tc.format}}
			if err := tb.Validate(); err != nil {
				b.Fatal(err)
			}
			ev := event(tb, "OrderCreated", string(payload))
			if err := apply(r, &kgo.Record{Topic: "orders", Value: payload}, ev); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.SetBytes(int64(len(payload)))
			b.ResetTimer()
			for range b.N {
				if err := r.Encode(&kgo.Record{Topic: "orders", Value: payload}, ev); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func make200() []byte {
	b := make([]byte, 200)
	for i := range b {
		b[i] = 'x'
	}
	return b
}

func newRegistryB(b *testing.B, url string) *Registry {
	cfg := Config{URL: url}
	if err := cfg.Validate(true); err != nil {
		b.Fatal(err)
	}
	r, err := New(cfg, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	return r
}
