// Command registry is an example consumer of topics the connector encodes
// against a Schema Registry (tables[].schema: avro, json-schema or
// protobuf; docs/config.md, "Schema Registry"). It decodes each value as a
// registry-aware deserialiser does and prints one line per record: topic,
// key, schema id and the value as JSON.
//
//	KAFKA_BROKERS=localhost:9092 SCHEMA_REGISTRY_URL=http://localhost:8081 go run ./examples/consumer/registry
//
// TOPICS (a regular expression, ^outbox\.event\..*) is optional. The
// schema id comes from Confluent's framing (a zero byte and the id,
// big-endian), or from the schema_id header when the connector keeps
// JSON Schema values as written (schema.id_in: header). Each schema is
// read from the registry by id once, and cached: ids are immutable. Avro
// is decoded with goavro; protobuf with the message the framing's indexes
// name, compiled from the registered .proto; JSON Schema values are the
// JSON itself. Java consumers get the same from Confluent's
// KafkaAvroDeserializer, KafkaJsonSchemaDeserializer and
// KafkaProtobufDeserializer.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/bufbuild/protocompile"
	"github.com/linkedin/goavro/v2"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, os.Stdout, getenv("KAFKA_BROKERS", "localhost:9092"), getenv("SCHEMA_REGISTRY_URL", "http://localhost:8081"), getenv("TOPICS", `^outbox\.event\..*`), -1)
	if err != nil && !errors.Is(err, context.Canceled) {
		log.Fatalf("registry consumer: %v", err)
	}
}

func getenv(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// run consumes topics from their start and prints each record decoded,
// until ctx ends or, when limit >= 0, limit records were printed.
func run(ctx context.Context, out io.Writer, brokers, registry, topics string, limit int) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(brokers, ",")...), kgo.ConsumeRegex(), kgo.ConsumeTopics(topics),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.MetadataMaxAge(5*time.Second)) // a topic the connector creates is found within 5 s
	if err != nil {
		return err
	}
	defer cl.Close()
	reg, err := sr.NewClient(sr.URLs(registry))
	if err != nil {
		return err
	}
	d := &decoder{reg: reg, schemas: map[int]decodeFunc{}}
	for n := 0; limit < 0 || n < limit; {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return err
		}
		if errs := fs.Errors(); len(errs) > 0 {
			return fmt.Errorf("fetch %s: %w", errs[0].Topic, errs[0].Err)
		}
		for _, r := range fs.Records() {
			id, doc, err := d.decode(ctx, r)
			if err != nil {
				return fmt.Errorf("%s offset %d: %w", r.Topic, r.Offset, err)
			}
			fmt.Fprintf(out, "%s %s %d %s\n", r.Topic, r.Key, id, doc)
			if n++; limit >= 0 && n >= limit {
				break
			}
		}
	}
	return nil
}

// decodeFunc turns an encoded value (after the id) into JSON.
type decodeFunc func(b []byte) ([]byte, error)

// decoder decodes values by the schema id they carry, caching each
// schema's decoder.
type decoder struct {
	reg     *sr.Client
	mu      sync.Mutex
	schemas map[int]decodeFunc
}

func (d *decoder) decode(ctx context.Context, r *kgo.Record) (int, []byte, error) {
	for _, h := range r.Headers {
		if h.Key == "schema_id" { // schema.id_in: header: the value is the JSON as written
			id, err := strconv.Atoi(string(h.Value))
			return id, r.Value, err
		}
	}
	var framing sr.ConfluentHeader
	id, rest, err := framing.DecodeID(r.Value)
	if err != nil {
		return 0, nil, fmt.Errorf("no schema id: %w", err)
	}
	f, err := d.schema(ctx, id)
	if err != nil {
		return id, nil, err
	}
	doc, err := f(rest)
	return id, doc, err
}

func (d *decoder) schema(ctx context.Context, id int) (decodeFunc, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if f, ok := d.schemas[id]; ok {
		return f, nil
	}
	s, err := d.reg.SchemaByID(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("schema id %d: %w", id, err)
	}
	var f decodeFunc
	switch s.Type {
	case sr.TypeAvro:
		c, err := goavro.NewCodec(s.Schema)
		if err != nil {
			return nil, err
		}
		f = func(b []byte) ([]byte, error) {
			native, _, err := c.NativeFromBinary(b)
			if err != nil {
				return nil, err
			}
			return c.TextualFromNative(nil, native)
		}
	case sr.TypeProtobuf:
		comp := protocompile.Compiler{Resolver: protocompile.WithStandardImports(&protocompile.SourceResolver{
			Accessor: protocompile.SourceAccessorFromMap(map[string]string{"registered.proto": s.Schema}),
		})}
		files, err := comp.Compile(ctx, "registered.proto")
		if err != nil {
			return nil, err
		}
		f = func(b []byte) ([]byte, error) {
			var framing sr.ConfluentHeader
			index, rest, err := framing.DecodeIndex(b, 16)
			if err != nil {
				return nil, err
			}
			md := message(files[0].Messages(), index)
			if md == nil {
				return nil, fmt.Errorf("schema id %d has no message at %v", id, index)
			}
			m := dynamicpb.NewMessage(md)
			if err := proto.Unmarshal(rest, m); err != nil {
				return nil, err
			}
			return protojson.Marshal(m)
		}
	default: // JSON Schema: the value is the JSON document
		f = func(b []byte) ([]byte, error) { return b, nil }
	}
	d.schemas[id] = f
	return f, nil
}

// message is the message the framing's index path names.
func message(ms protoreflect.MessageDescriptors, index []int) protoreflect.MessageDescriptor {
	var md protoreflect.MessageDescriptor
	for _, i := range index {
		if i >= ms.Len() {
			return nil
		}
		md = ms.Get(i)
		ms = md.Messages()
	}
	return md
}
