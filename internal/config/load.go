package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"reflect"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/outboxcdc/cdc/internal/endpoint"
	"github.com/outboxcdc/cdc/internal/errtext"
	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/pgident"
	"github.com/outboxcdc/cdc/internal/schema"
	"github.com/outboxcdc/cdc/internal/secret"
	"github.com/outboxcdc/cdc/internal/sink"
)

// fileConfig is the YAML file format: the Config itself, whose keys and
// its stages' are the file's, and the sections Load maps onto the Config
// by hand (a table's name and columns are parsed, the registry's basic_auth
// and a few settings sit elsewhere in the file than in the Config, and log
// and http are the process's). docs/config.md documents every key; keep
// the two in step.
type fileConfig struct {
	Config         `yaml:",inline"`
	SchemaRegistry struct {
		URL       string `yaml:"url"`
		BasicAuth struct {
			Username     string `yaml:"username"`
			Password     string `yaml:"password"`
			PasswordFile string `yaml:"password_file"`
		} `yaml:"basic_auth"`
		TokenFile string `yaml:"token_file"`
		TLS       struct {
			CAFile     string `yaml:"ca_file"`
			CertFile   string `yaml:"cert_file"`
			KeyFile    string `yaml:"key_file"`
			ServerName string `yaml:"server_name"`
		} `yaml:"tls"`
		AutoRegister bool          `yaml:"auto_register"`
		MissingAfter time.Duration `yaml:"missing_subject_after"`
		Timeout      time.Duration `yaml:"timeout"`
	} `yaml:"schema_registry"`
	Tables    []fileTable `yaml:"tables"`
	Reconnect struct {
		Backoff    time.Duration `yaml:"backoff"`
		BackoffMax time.Duration `yaml:"backoff_max"`
	} `yaml:"reconnect"`
	Log struct {
		Level  string `yaml:"level"`
		Format string `yaml:"format"`
		Kafka  string `yaml:"kafka"`
	} `yaml:"log"`
	HTTP struct {
		Listen    *string `yaml:"listen"`
		Token     string  `yaml:"token"`
		TokenFile string  `yaml:"token_file"`
		// UnhealthyAfter: how long without streaming before /healthz fails.
		UnhealthyAfter time.Duration `yaml:"unhealthy_after"`
	} `yaml:"http"`
}

// fileTable is one entry of tables: an outbox table, or a logical decoding
// message prefix.
type fileTable struct {
	Name          string `yaml:"name"`
	MessagePrefix string `yaml:"message_prefix"`
	// Columns maps fields to columns (or JSON members). An absent key
	// keeps the default; null or "" leaves the field unmapped.
	Columns    map[string]*string `yaml:"columns"`
	Additional []struct {
		Column    string `yaml:"column"`
		Placement string `yaml:"placement"`
		As        string `yaml:"as"`
	} `yaml:"additional"`
	Topic                   string            `yaml:"topic"`
	TopicNormalize          []string          `yaml:"topic_normalize"`
	TopicReplacement        string            `yaml:"topic_replacement"`
	MaxTopics               int               `yaml:"max_topics"`
	Key                     string            `yaml:"key"`
	Format                  string            `yaml:"format"`
	Headers                 map[string]string `yaml:"headers"`
	CloudEventsSource       string            `yaml:"cloudevents_source"`
	TombstoneOnEmptyPayload bool              `yaml:"tombstone_on_empty_payload"`
	OnInvalid               string            `yaml:"on_invalid"`
	DeadLetterTopic         string            `yaml:"dead_letter_topic"`
	ParkedTopic             string            `yaml:"parked_topic"`
	OnInvalidUnkeyed        string            `yaml:"on_invalid_unkeyed"`
	Schema                  fileSchema        `yaml:"schema"`
	Backfill                *struct {
		Where     string `yaml:"where"`
		OrderBy   string `yaml:"order_by"`
		ChunkSize int    `yaml:"chunk_size"`
	} `yaml:"backfill"`
	Retention *struct {
		After     time.Duration `yaml:"after"`
		BatchSize int           `yaml:"batch_size"`
		Mode      string        `yaml:"mode"`
	} `yaml:"retention"`
	// Filter and Expressions are CEL (docs/config.md, "Expressions").
	Filter      string `yaml:"filter"`
	Expressions struct {
		Topic     string            `yaml:"topic"`
		Key       string            `yaml:"key"`
		Partition string            `yaml:"partition"`
		Headers   map[string]string `yaml:"headers"`
	} `yaml:"expressions"`
}

// fileSchema is tables[].schema: a mapping, or just the format
// (schema: avro).
type fileSchema struct {
	Format  string `yaml:"format"`
	Subject string `yaml:"subject"`
	Version string `yaml:"version"` // latest (default) or a number
	IDIn    string `yaml:"id_in"`
	Key     bool   `yaml:"key"`
	Message string `yaml:"message"`
	File    string `yaml:"file"`
}

// UnmarshalYAML takes the short form, a scalar naming the format.
func (s *fileSchema) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		s.Format = n.Value
		return nil
	}
	type plain fileSchema
	return n.Decode((*plain)(s))
}

// shorthand marks a mapping that may be written as one scalar.
func (fileSchema) shorthand() {}

func (s fileSchema) schema() (outbox.Schema, error) {
	out := outbox.Schema{Format: s.Format, Subject: s.Subject, IDIn: s.IDIn, Key: s.Key, Message: s.Message, File: s.File}
	if s.Version != "" && s.Version != "latest" {
		v, err := strconv.Atoi(s.Version)
		if err != nil || v < 1 {
			return out, fmt.Errorf("schema.version %q: use latest or a version number", s.Version)
		}
		out.Version = v
	}
	return out, nil
}

// DefaultListen is where cdc run serves /metrics, /healthz and /readyz.
const DefaultListen = "127.0.0.1:9187"

// Log is how the process logs, and serves its HTTP endpoint.
type Log struct {
	Level string // trace, debug, info (default), warn, error
	JSON  bool
	HTTP  endpoint.Config
	// SecretFiles are the files the config names that hold secrets: the
	// password, token, key and signing key files (FileWeaknesses).
	SecretFiles []string
}

// Weaknesses lists what leaves the endpoint, or a secret file, open to
// others: cdc run logs each at start, cdc check lists them.
func (l Log) Weaknesses() []string {
	ws := l.HTTP.Weaknesses()
	for _, f := range l.SecretFiles {
		if st, err := os.Stat(f); err == nil && st.Mode().Perm()&0o004 != 0 {
			ws = append(ws, fmt.Sprintf("%s holds a secret and every user of this host may read it (mode %04o): chmod o-rwx %s", f, st.Mode().Perm(), f))
		}
	}
	return ws
}

// Load reads the YAML file at path ("" for none) and applies the
// environment: ${VAR} in the file's values, then CDC_<KEY> variables,
// which override the file's keys (docs/config.md, "Environment"). It
// reports what is wrong with the file itself; the packages' own
// validation, with the defaults, runs once in pipeline.New.
func Load(path string, env Environ) (Config, Log, error) {
	fc, err := readFile(path, env)
	if err != nil {
		return Config{}, Log{}, err
	}
	lc, err := fc.log(env)
	if err != nil {
		return Config{}, Log{}, err
	}
	var signingKeys [][]byte
	if f := fc.Checkpoint.SigningKeyFile; f != "" {
		if signingKeys, err = readSigningKeys(f); err != nil {
			return Config{}, Log{}, err
		}
	}
	cfg := fc.config(signingKeys)
	if len(fc.Tables) == 0 {
		// Debezium's default layout, so that a config-less start works.
		cfg.Tables = []*outbox.Source{{Name: outbox.TableName{Schema: "public", Name: "outbox"}, Columns: outbox.DefaultColumns}}
	}
	for i, ft := range fc.Tables {
		t, err := ft.table()
		if err != nil {
			return Config{}, Log{}, fmt.Errorf("tables[%d]: %w", i, err)
		}
		cfg.Tables = append(cfg.Tables, t)
	}
	return cfg, lc, nil
}

// readFile reads the YAML file at path ("" for none), expands ${VAR} in
// its values, applies the CDC_<KEY> variables and checks every key.
func readFile(path string, env Environ) (fileConfig, error) {
	var fc fileConfig
	var doc yaml.Node
	where := "config " + path
	if path != "" {
		raw, err := os.ReadFile(path)
		if err != nil {
			return fc, fmt.Errorf("read config: %w", err)
		}
		if err := yaml.NewDecoder(bytes.NewReader(raw)).Decode(&doc); err != nil && !errors.Is(err, io.EOF) {
			return fc, fmt.Errorf("%s: %s", where, yamlError(err))
		}
		if err := expandEnv(&doc, env, ""); err != nil {
			return fc, fmt.Errorf("%s: %w", where, err)
		}
	} else {
		where = "config"
	}
	if err := applyEnv(&doc, reflect.TypeOf(fc), env); err != nil {
		return fc, fmt.Errorf("%s: %w", where, err)
	}
	if err := checkNode(&doc, reflect.TypeOf(fc), ""); err != nil {
		return fc, fmt.Errorf("%s: %w", where, err)
	}
	if doc.Kind != 0 {
		if err := doc.Decode(&fc); err != nil {
			return fc, fmt.Errorf("%s: %s (see docs/config.md)", where, yamlError(err))
		}
	}
	return fc, nil
}

// log is the file's log and http sections, and the secret files it names.
func (fc *fileConfig) log(env Environ) (Log, error) {
	lc := Log{Level: strings.ToLower(fc.Log.Level), HTTP: endpoint.Config{Listen: DefaultListen, Token: fc.HTTP.Token}}
	if fc.HTTP.Listen != nil {
		lc.HTTP.Listen = *fc.HTTP.Listen
	}
	if v, ok := env("CDC_HTTP_LISTEN"); ok && v == "" {
		lc.HTTP.Listen = "" // set but empty turns it off
	}
	if lc.HTTP.Listen != "" {
		// Port 0 picks a free port (the tests use it).
		_, port, err := net.SplitHostPort(lc.HTTP.Listen)
		if n, perr := strconv.Atoi(port); err != nil || perr != nil || n < 0 || n > 65535 {
			return lc, fmt.Errorf("http.listen %q is not host:port; use 127.0.0.1:9187, 0.0.0.0:9187 in a container, or \"\" to turn the endpoint off", lc.HTTP.Listen)
		}
	}
	if fc.HTTP.TokenFile != "" {
		// Read now to refuse a missing or empty file at start; the
		// endpoint reads it again when it changes.
		if _, err := secret.Read(fc.HTTP.TokenFile); err != nil {
			return lc, fmt.Errorf("http.token_file: %v", err)
		}
		lc.HTTP.Token, lc.HTTP.TokenFile = "", fc.HTTP.TokenFile
	}
	for _, f := range []string{fc.Postgres.PasswordFile, fc.Kafka.TLS.KeyFile, fc.Kafka.SASL.PasswordFile, fc.Kafka.SASL.TokenFile,
		fc.Checkpoint.SigningKeyFile, fc.SchemaRegistry.BasicAuth.PasswordFile, fc.SchemaRegistry.TokenFile, fc.SchemaRegistry.TLS.KeyFile, fc.HTTP.TokenFile} {
		if f != "" {
			lc.SecretFiles = append(lc.SecretFiles, f)
		}
	}
	if lc.Level == "" {
		lc.Level = "info"
	}
	switch lc.Level {
	case "trace", "debug", "info", "warn", "error":
	default:
		return lc, fmt.Errorf("log.level %q: use trace, debug, info, warn or error", fc.Log.Level)
	}
	switch fc.Log.Format {
	case "", "text":
	case "json":
		lc.JSON = true
	default:
		return lc, fmt.Errorf("log.format %q: use text or json", fc.Log.Format)
	}
	return lc, nil
}

// config is the Config the file decoded into, with what the file keeps
// in its other sections; the defaults are the stages', filled by Validate.
func (fc *fileConfig) config(signingKeys [][]byte) Config {
	cfg := fc.Config
	cfg.Checkpoint.SigningKeys = signingKeys
	cfg.Kafka.ClientLog = fc.Log.Kafka
	cfg.RetryBackoff, cfg.RetryBackoffMax = fc.Reconnect.Backoff, fc.Reconnect.BackoffMax
	cfg.UnhealthyAfter = fc.HTTP.UnhealthyAfter
	r := fc.SchemaRegistry
	cfg.SchemaRegistry = schema.Config{URL: r.URL, Username: r.BasicAuth.Username, Password: r.BasicAuth.Password, PasswordFile: r.BasicAuth.PasswordFile,
		TokenFile: r.TokenFile, AutoRegister: r.AutoRegister, Timeout: r.Timeout, MissingAfter: r.MissingAfter,
		TLS: sink.TLSConfig{CAFile: r.TLS.CAFile, CertFile: r.TLS.CertFile, KeyFile: r.TLS.KeyFile, ServerName: r.TLS.ServerName}}
	return cfg
}

func (ft fileTable) table() (*outbox.Source, error) {
	t := &outbox.Source{
		MessagePrefix:     ft.MessagePrefix,
		Topic:             ft.Topic,
		Key:               ft.Key,
		Format:            ft.Format,
		Headers:           ft.Headers,
		CloudEventsSource: ft.CloudEventsSource,
		Tombstone:         ft.TombstoneOnEmptyPayload,
		OnInvalid:         ft.OnInvalid,
		DeadLetterTopic:   ft.DeadLetterTopic,
		ParkedTopic:       ft.ParkedTopic, OnInvalidUnkeyed: ft.OnInvalidUnkeyed,
		MaxTopics: ft.MaxTopics,
	}
	var err error
	if t.Schema, err = ft.Schema.schema(); err != nil {
		return nil, err
	}
	if err := ft.topicNormalize(t); err != nil {
		return nil, err
	}
	isMessage := ft.MessagePrefix != ""
	switch {
	case isMessage && ft.Name != "":
		return nil, fmt.Errorf("set name (a table) or message_prefix (logical decoding messages), not both")
	case isMessage:
		t.Columns = outbox.DefaultMessageFields
	case ft.Name == "":
		return nil, fmt.Errorf("name is required (or message_prefix for logical decoding messages)")
	default:
		name, err := outbox.ParseTableName(ft.Name)
		if err != nil {
			return nil, fmt.Errorf("name: %w", err)
		}
		t.Name, t.Columns = name, outbox.DefaultColumns
	}
	if err := ft.columns(t, isMessage); err != nil {
		return nil, err
	}
	x := ft.Expressions
	t.Filter, t.Expressions = ft.Filter, outbox.Expressions{Topic: x.Topic, Key: x.Key, Partition: x.Partition, Headers: x.Headers}
	if r := ft.Retention; r != nil {
		t.Retention = &outbox.Retention{After: r.After, BatchSize: r.BatchSize, Mode: r.Mode}
	}
	if b := ft.Backfill; b != nil {
		t.Backfill = &outbox.BackfillOptions{Where: strings.TrimSpace(b.Where), ChunkSize: b.ChunkSize}
		if strings.TrimSpace(b.OrderBy) != "" {
			cols, err := pgident.ParseList(b.OrderBy)
			if err != nil {
				return nil, fmt.Errorf("backfill.order_by: %w", err)
			}
			t.Backfill.OrderBy = cols
		}
	}
	return t, nil
}

// topicNormalize reads topic_normalize and topic_replacement into t.
func (ft fileTable) topicNormalize(t *outbox.Source) error {
	for _, n := range ft.TopicNormalize {
		switch n {
		case "lowercase":
			t.TopicLowercase = true
		case "replace-illegal":
			t.TopicReplaceIllegal = ft.TopicReplacement
			if t.TopicReplaceIllegal == "" {
				t.TopicReplaceIllegal = "_"
			}
		default:
			return fmt.Errorf("topic_normalize: %q: use lowercase or replace-illegal", n)
		}
	}
	if ft.TopicReplacement != "" && t.TopicReplaceIllegal == "" {
		return fmt.Errorf("topic_replacement is set but topic_normalize does not include replace-illegal")
	}
	return nil
}

// columns reads columns and additional into t: columns as written in
// SQL, or for a message source JSON members, taken as they are.
func (ft fileTable) columns(t *outbox.Source, isMessage bool) error {
	ident := func(s string) (string, error) {
		if isMessage {
			return s, nil
		}
		return pgident.Parse(s)
	}
	for key, val := range ft.Columns {
		f, ok := outbox.FieldByName(key)
		if !ok {
			return fmt.Errorf("columns.%s: unknown field; use %s", key, strings.Join(outbox.FieldNames[:], ", "))
		}
		if val == nil || *val == "" {
			t.Columns[f] = ""
			continue
		}
		c, err := ident(*val)
		if err != nil {
			return fmt.Errorf("columns.%s: %w", key, err)
		}
		t.Columns[f] = c
	}
	for i, a := range ft.Additional {
		c, err := ident(a.Column)
		if err != nil {
			return fmt.Errorf("additional[%d].column: %w", i, err)
		}
		t.Additional = append(t.Additional, outbox.Additional{Column: c, Placement: a.Placement, As: a.As})
	}
	return nil
}

// yamlError flattens yaml.v3's multi-line errors ("yaml: unmarshal
// errors:\n  line 3: ...") into one line.
func yamlError(err error) string {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	return errtext.Flatten(strings.TrimPrefix(msg, "unmarshal errors:\n  "))
}

// readSigningKeys reads checkpoint.signing_key_file: one key a line, the
// first signing, every one verifying (a key being rotated in or out). The
// errors never show a key.
func readSigningKeys(file string) ([][]byte, error) {
	lines, err := secret.Lines(file)
	if err != nil {
		return nil, fmt.Errorf("checkpoint.signing_key_file: %v; put a key in it: openssl rand -hex 32 > %s", err, file)
	}
	var keys [][]byte
	for i, line := range lines {
		if len(line) < 32 {
			return nil, fmt.Errorf("checkpoint.signing_key_file %s: key %d is %d characters; use at least 32 (openssl rand -hex 32)", file, i+1, len(line))
		}
		keys = append(keys, []byte(line))
	}
	return keys, nil
}
