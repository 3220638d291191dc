package outbox

import "fmt"

// Wire formats of a value, chosen by tables[].schema. Every format but
// SchemaJSON takes its schema from the Schema Registry (internal/schema).
const (
	SchemaJSON       = "json"        // the payload's bytes as written (default)
	SchemaJSONSchema = "json-schema" // the same bytes, checked against a JSON Schema
	SchemaAvro       = "avro"        // the JSON payload encoded as Avro binary
	SchemaProtobuf   = "protobuf"    // the JSON payload encoded as a protobuf message
)

// Subject naming strategies, as the registry's serialisers name them.
const (
	SubjectTopic       = "topic"        // <topic>-value
	SubjectRecord      = "record"       // the event type
	SubjectTopicRecord = "topic-record" // <topic>-<event type>
)

// Where the schema id goes.
const (
	IDInPrefix = "prefix" // Confluent's framing: a zero byte and the id, big-endian
	IDInHeader = "header" // a schema_id header; the value's bytes stay as written
)

// Schema is a source's data contract: how its payload is checked and
// encoded against the registry. The zero value is SchemaJSON: no registry.
type Schema struct {
	Format  string // one of the Schema constants
	Subject string // naming strategy; SubjectTopic by default
	// Version pins the subject's version; 0 takes the latest, re-read
	// when an event does not fit the one cached.
	Version int
	IDIn    string // IDInPrefix (default) or IDInHeader (json-schema only)
	// Key encodes the key too, as a JSON string, with the subject
	// <topic>-key. Off: the key stays the template's text.
	Key bool
	// Message is the protobuf message's full name; default the schema's
	// first message.
	Message string
	// File is the schema to register under the subject when it has
	// none and schema_registry.auto_register is on.
	File string
}

// Registered reports whether the source needs the registry.
func (s *Schema) Registered() bool { return s.Format != "" && s.Format != SchemaJSON }

// validate fills s's defaults and checks it against the table's other
// settings.
func (s *Schema) validate(t *Source) error {
	switch s.Format {
	case "", SchemaJSON:
		s.Format = SchemaJSON
		if s.Subject != "" || s.Version != 0 || s.IDIn != "" || s.Key || s.Message != "" || s.File != "" {
			return fmt.Errorf("%s: schema format json takes no other schema settings; set schema.format to json-schema, avro or protobuf", t)
		}
		return nil
	case SchemaJSONSchema, SchemaAvro, SchemaProtobuf:
	default:
		return fmt.Errorf("%s: schema %q: use json, json-schema, avro or protobuf", t, s.Format)
	}
	if t.Format != FormatPayload && t.Format != FormatCloudEventsBinary {
		return fmt.Errorf("%s: schema %s encodes the payload as the record's value, which format %s wraps; use format payload or cloudevents-binary", t, s.Format, t.Format)
	}
	switch s.Subject {
	case "":
		s.Subject = SubjectTopic
	case SubjectTopic:
	case SubjectRecord, SubjectTopicRecord:
		if t.Columns[FieldEventType] == "" {
			return fmt.Errorf("%s: schema.subject %s names subjects after the event type; map the event_type field, or use schema.subject topic", t, s.Subject)
		}
	default:
		return fmt.Errorf("%s: schema.subject %q: use topic, record or topic-record", t, s.Subject)
	}
	if s.File != "" && s.Subject != SubjectTopic {
		return fmt.Errorf("%s: schema.file is one schema, and schema.subject %s names a subject per event type, which a row chooses: register each event type's schema in the registry, or use schema.subject topic", t, s.Subject)
	}
	if s.Version < 0 {
		return fmt.Errorf("%s: schema.version %d: use a version number, or leave it out for the latest", t, s.Version)
	}
	switch s.IDIn {
	case "":
		s.IDIn = IDInPrefix
	case IDInPrefix:
	case IDInHeader:
		if s.Format != SchemaJSONSchema {
			return fmt.Errorf("%s: schema.id_in header keeps the value's bytes as written, which only json-schema does; use id_in prefix with %s", t, s.Format)
		}
	default:
		return fmt.Errorf("%s: schema.id_in %q: use prefix or header", t, s.IDIn)
	}
	if s.Key && s.Format == SchemaProtobuf {
		return fmt.Errorf("%s: schema.key: a protobuf key needs a message for a string; use key: false (the key stays text) with protobuf", t)
	}
	if s.Message != "" && s.Format != SchemaProtobuf {
		return fmt.Errorf("%s: schema.message names a protobuf message; leave it out with %s", t, s.Format)
	}
	return nil
}
