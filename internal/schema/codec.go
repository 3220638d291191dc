package schema

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/bufbuild/protocompile"
	"github.com/linkedin/goavro/v2"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/twmb/franz-go/pkg/sr"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/outboxcdc/cdc/internal/errtext"
	"github.com/outboxcdc/cdc/internal/outbox"
)

// A codec checks a JSON document against one schema and appends its wire
// form. Each is built by its format's library; none is hand-written.
type codec interface {
	// append appends doc encoded to dst, or says why doc does not match.
	append(dst, doc []byte) ([]byte, error)
	// check says why doc does not match, or nil, without encoding.
	check(doc []byte) error
	// index is the protobuf message's index path (Confluent's framing);
	// nil for the other formats.
	index() []int
}

// registryType is the registry's name for format's schemas.
func registryType(format string) sr.SchemaType {
	switch format {
	case outbox.SchemaJSONSchema:
		return sr.TypeJSON
	case outbox.SchemaProtobuf:
		return sr.TypeProtobuf
	}
	return sr.TypeAvro
}

// compile builds format's codec for a registered schema. message picks a
// protobuf message ("" the first).
func compile(format, text, message string) (codec, error) {
	switch format {
	case outbox.SchemaAvro:
		return newAvro(text)
	case outbox.SchemaJSONSchema:
		return newJSONSchema(text)
	case outbox.SchemaProtobuf:
		return newProtobuf(text, message)
	}
	return nil, fmt.Errorf("schema format %q has no codec", format)
}

// avroCodec encodes with goavro. A payload may be plain JSON (a union's
// value as itself, as applications write it) or Avro's JSON encoding (a
// non-null union value wrapped in {"type": value}); plain is tried first.
type avroCodec struct {
	plain, avroJSON *goavro.Codec
}

func newAvro(text string) (*avroCodec, error) {
	plain, err := goavro.NewCodecForStandardJSONFull(text)
	if err != nil {
		return nil, err
	}
	avroJSON, err := goavro.NewCodec(text)
	if err != nil {
		return nil, err
	}
	return &avroCodec{plain: plain, avroJSON: avroJSON}, nil
}

func (c *avroCodec) native(doc []byte) (any, error) {
	v, rest, err := c.plain.NativeFromTextual(doc)
	if err != nil {
		v2, rest2, err2 := c.avroJSON.NativeFromTextual(doc)
		if err2 != nil {
			return nil, err
		}
		v, rest, err = v2, rest2, nil
	}
	if len(bytes.TrimSpace(rest)) > 0 {
		return nil, errors.New("text after the JSON document")
	}
	return v, nil
}

func (c *avroCodec) append(dst, doc []byte) ([]byte, error) {
	v, err := c.native(doc)
	if err != nil {
		return nil, err
	}
	return c.plain.BinaryFromNative(dst, v)
}

func (c *avroCodec) check(doc []byte) error {
	_, err := c.append(nil, doc)
	return err
}

func (*avroCodec) index() []int { return nil }

// jsonSchemaCodec validates with santhosh-tekuri/jsonschema; the bytes go
// out as written.
type jsonSchemaCodec struct {
	s *jsonschema.Schema
}

func newJSONSchema(text string) (*jsonSchemaCodec, error) {
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(text))
	if err != nil {
		return nil, err
	}
	c := jsonschema.NewCompiler()
	// The compiler would read a $ref to file:// from the local disk: a
	// schema in the registry must not make the connector read files.
	c.UseLoader(refusingLoader{})
	if err := c.AddResource("registry.json", doc); err != nil {
		return nil, err
	}
	s, err := c.Compile("registry.json")
	if err != nil {
		return nil, err
	}
	return &jsonSchemaCodec{s: s}, nil
}

// refusingLoader loads no schema from outside the one the registry gave.
type refusingLoader struct{}

func (refusingLoader) Load(url string) (any, error) {
	return nil, fmt.Errorf("the schema refers to %s: the connector loads no schema from outside the registry; inline it", url)
}

func (c *jsonSchemaCodec) check(doc []byte) error {
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(doc))
	if err != nil {
		return fmt.Errorf("not a JSON document: %v", err)
	}
	if err := c.s.Validate(v); err != nil {
		return errors.New(errtext.OneLine(err))
	}
	return nil
}

func (c *jsonSchemaCodec) append(dst, doc []byte) ([]byte, error) {
	if err := c.check(doc); err != nil {
		return nil, err
	}
	return append(dst, doc...), nil
}

func (*jsonSchemaCodec) index() []int { return nil }

// protobufCodec compiles the registered .proto with protocompile and
// encodes through protojson into a dynamic message.
type protobufCodec struct {
	md  protoreflect.MessageDescriptor
	idx []int
}

func newProtobuf(text, message string) (*protobufCodec, error) {
	const name = "registry.proto"
	comp := protocompile.Compiler{Resolver: protocompile.WithStandardImports(&protocompile.SourceResolver{
		Accessor: protocompile.SourceAccessorFromMap(map[string]string{name: text}),
	})}
	files, err := comp.Compile(context.Background(), name)
	if err != nil {
		return nil, errors.New(errtext.OneLine(err))
	}
	md, idx := findMessage(files[0].Messages(), message, nil)
	if md == nil {
		if message == "" {
			return nil, errors.New("the schema declares no message")
		}
		return nil, fmt.Errorf("the schema declares no message %q (tables[].schema.message)", message)
	}
	return &protobufCodec{md: md, idx: idx}, nil
}

// findMessage finds message (full or short name; "" the first) among ms
// and the messages they nest, with its index path.
func findMessage(ms protoreflect.MessageDescriptors, message string, path []int) (protoreflect.MessageDescriptor, []int) {
	for i := 0; i < ms.Len(); i++ {
		md := ms.Get(i)
		p := append(append([]int(nil), path...), i)
		if message == "" || string(md.FullName()) == message || string(md.Name()) == message {
			return md, p
		}
		if found, fp := findMessage(md.Messages(), message, p); found != nil {
			return found, fp
		}
	}
	return nil, nil
}

func (c *protobufCodec) append(dst, doc []byte) ([]byte, error) {
	m := dynamicpb.NewMessage(c.md)
	if err := protojson.Unmarshal(doc, m); err != nil {
		return nil, errors.New(errtext.OneLine(err))
	}
	return proto.MarshalOptions{}.MarshalAppend(dst, m)
}

func (c *protobufCodec) check(doc []byte) error {
	_, err := c.append(nil, doc)
	return err
}

func (c *protobufCodec) index() []int { return c.idx }
