package config

import (
	"github.com/outboxcdc/cdc/internal/testenv"

	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/route"
)

// validConfig is what cdc run works with: the file and environment as
// Load reads them, validated once as pipeline.New does.
func validConfig(path string, getenv Environ) (Config, Log, error) {
	cfg, lc, err := Load(path, getenv)
	if err != nil {
		return Config{}, Log{}, err
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, Log{}, err
	}
	if _, err := route.New(cfg.Tables); err != nil {
		return Config{}, Log{}, err
	}
	return cfg, lc, nil
}

// writeConfig writes body as a config file in a temporary directory.
var writeConfig = testenv.WriteConfig

// env is an environment of these key, value pairs.
var env = Map

// noEnv is an empty environment.
var noEnv = env()

func TestLoadConfigDefaults(t *testing.T) {
	cfg, lc, err := validConfig("", env("CDC_POSTGRES_URL", "postgres://u:p@db/app", "CDC_KAFKA_BROKERS", "k1:9092, k2:9092"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Postgres.Slot != "outbox_cdc" || cfg.Postgres.Publication != "outbox_cdc" || cfg.Postgres.StatusInterval != time.Second {
		t.Errorf("postgres defaults = %+v", cfg.Postgres)
	}
	if cfg.Name != "outbox_cdc" {
		t.Errorf("name = %q, want the slot's", cfg.Name)
	}
	if strings.Join(cfg.Kafka.Brokers, ",") != "k1:9092,k2:9092" || !cfg.Kafka.AutoCreate() || !cfg.Kafka.Creates() {
		t.Errorf("kafka = %+v", cfg.Kafka)
	}
	if len(cfg.Tables) != 1 || cfg.Tables[0].Name != (outbox.TableName{Schema: "public", Name: "outbox"}) ||
		cfg.Tables[0].Columns != outbox.DefaultColumns || cfg.Tables[0].Topic != "outbox.event.{aggregate_type}" {
		t.Errorf("default table = %+v", cfg.Tables[0])
	}
	if cfg.MaxInFlight != DefaultMaxInFlight || cfg.ShutdownTimeout != 30*time.Second || lc.Level != "info" || lc.JSON {
		t.Errorf("cfg = %+v, log = %+v", cfg, lc)
	}
}

func TestLoadConfigFile(t *testing.T) {
	p := writeConfig(t, `
postgres:
  url: postgres://file@db/app
  slot: orders_slot
  status_interval: 250ms
kafka:
  brokers: [file:9092]
  allow_auto_topic_creation: false
  max_message_bytes: 2000000
tables:
  - name: tenant."OutboxEvent"
    topic: "{aggregate_type}.events"
    columns:
      aggregate_type: '"aggregateType"'
      aggregate_id: '"aggregateId"'
      event_type: '"eventType"'
  - name: event_outbox
max_in_flight: 500
shutdown_timeout: 5s
log:
  level: debug
  format: json
`)
	cfg, lc, err := validConfig(p, env("CDC_POSTGRES_URL", "postgres://env@db/app"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Postgres.URL != "postgres://env@db/app" {
		t.Errorf("CDC_POSTGRES_URL must override the file: %q", cfg.Postgres.URL)
	}
	if cfg.Postgres.Slot != "orders_slot" || cfg.Postgres.StatusInterval != 250*time.Millisecond {
		t.Errorf("postgres = %+v", cfg.Postgres)
	}
	if cfg.Kafka.Brokers[0] != "file:9092" || cfg.Kafka.AutoCreate() || cfg.Kafka.MaxMessageBytes != 2_000_000 {
		t.Errorf("kafka = %+v", cfg.Kafka)
	}
	t0 := cfg.Tables[0]
	want := outbox.Columns{outbox.FieldID: "id", outbox.FieldAggregateType: "aggregateType", outbox.FieldAggregateID: "aggregateId",
		outbox.FieldEventType: "eventType", outbox.FieldPayload: "payload"}
	if t0.Name != (outbox.TableName{Schema: "tenant", Name: "OutboxEvent"}) || t0.Columns != want || t0.Topic != "{aggregate_type}.events" {
		t.Errorf("tables[0] = %+v", t0)
	}
	if cfg.Tables[1].Name.Name != "event_outbox" || cfg.Tables[1].Topic != outbox.DefaultTopic {
		t.Errorf("tables[1] = %+v", cfg.Tables[1])
	}
	if cfg.MaxInFlight != 500 || cfg.ShutdownTimeout != 5*time.Second || lc.Level != "debug" || !lc.JSON {
		t.Errorf("cfg = %+v, log = %+v", cfg, lc)
	}
}

func TestLoadConfigErrors(t *testing.T) {
	shortKeyFile := filepath.Join(t.TempDir(), "short.key")
	if err := os.WriteFile(shortKeyFile, []byte("too-short\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := "postgres: {url: 'postgres://u@h/d'}\nkafka: {brokers: [k:1]}\n"
	tests := []struct {
		name, body, want string
	}{
		{"unknown key", base + "kafak: {}\n", "unknown key kafak (line 3); did you mean kafka?"},
		{"unknown nested key", "postgres: {url: 'postgres://u@h/d', slots: x}\nkafka: {brokers: [k:1]}\n", "unknown key postgres.slots (line 1); did you mean slot?"},
		{"swapped letters", "postgres: {url: 'postgres://u@h/d'}\nkafka:\n  borkers: [k:1]\n", "unknown key kafka.borkers (line 3); did you mean brokers?"},
		{"unknown key in a table", base + "tables: [{name: outbox, topik: x}]\n", "unknown key tables[0].topik (line 3); did you mean topic?"},
		{"nothing close", base + "zzz: 1\n", "unknown key zzz (line 3); the keys here are backfill, checkpoint, delivery, exactly_once, http, kafka,"},
		{"bad name", base + "name: orders db\n", `name "orders db": use at most 63 letters, digits, '.', '_' and '-'`},
		{"bad duration", base + "shutdown_timeout: soon\n", `shutdown_timeout (line 3): "soon" is not a duration; write a number with a unit`},
		{"duration without unit", base + "replay: {window: 5}\n", `replay.window (line 3): "5" is not a duration`},
		{"bad number", base + "max_in_flight: lots\n", `max_in_flight (line 3): "lots" is not a whole number`},
		{"bad switch", "postgres: {url: 'postgres://u@h/d'}\nkafka: {brokers: [k:1], create_topics: 'yes please'}\n", `kafka.create_topics (line 2): "yes please" is not true or false`},
		{"section not a mapping", base + "log: debug\n", "log (line 3): expected a mapping of keys"},
		{"broken YAML", base + "tables: [\n", "line 3: did not find expected node content"},
		{"no brokers", "postgres: {url: 'postgres://u@h/d'}\n", "CDC_KAFKA_BROKERS"},
		{"no url", "kafka: {brokers: [k:1]}\n", "CDC_POSTGRES_URL"},
		{"bad slot", "postgres: {url: 'postgres://u@h/d', slot: Bad-Slot}\nkafka: {brokers: [k:1]}\n", "postgres.slot \"Bad-Slot\""},
		{"bad table", base + "tables: [{name: 'a.b.c'}]\n", "tables[0]: name"},
		{"bad column", base + "tables: [{name: outbox, columns: {id: '\"x'}}]\n", "tables[0]: columns.id"},
		{"unknown field", base + "tables: [{name: outbox, columns: {kind: x}}]\n", "columns.kind: unknown field"},
		{"name and prefix", base + "tables: [{name: outbox, message_prefix: p}]\n", "not both"},
		{"bad format", base + "tables: [{name: outbox, format: avro}]\n", "format \"avro\""},
		{"bad policy", base + "tables: [{name: outbox, on_invalid: skip}]\n", "on_invalid \"skip\""},
		{"bad placement", base + "tables: [{name: outbox, additional: [{column: a, placement: body}]}]\n", "placement \"body\""},
		{"unknown header", base + "tables: [{name: outbox, headers: {idd: x}}]\n", "unknown header \"idd\""},
		{"bad normalisation", base + "tables: [{name: outbox, topic_normalize: [upper]}]\n", "topic_normalize"},
		{"replacement without normalisation", base + "tables: [{name: outbox, topic_replacement: x}]\n", "replace-illegal"},
		{"illegal replacement", base + "tables: [{name: outbox, topic_normalize: [replace-illegal], topic_replacement: '/'}]\n", "must itself be legal"},
		{"unmapped field in template", base + "tables: [{name: outbox, topic: '{tenant}'}]\n", "not mapped"},
		{"bad template", base + "tables: [{name: outbox, topic: 'x.{nope}'}]\n", "unknown placeholder"},
		{"duplicate table", base + "tables: [{name: outbox}, {name: public.outbox}]\n", "configured twice"},
		{"no payload", base + "tables: [{name: outbox, columns: {payload: null}}]\n", "payload field must be mapped"},
		{"bad log level", base + "log: {level: loud}\n", "log.level"},
		{"bad client log", base + "log: {kafka: wire}\n", "log.kafka \"wire\""},
		{"backoff max below the first", base + "reconnect: {backoff: 10s, backoff_max: 1s}\n", "reconnect.backoff 10s and backoff_max 1s"},
		{"bad status interval", "postgres: {url: 'postgres://u@h/d', status_interval: 90s}\nkafka: {brokers: [k:1]}\n", "status_interval"},
		{"receive timeout under three status intervals", "postgres: {url: 'postgres://u@h/d', status_interval: 10s, receive_timeout: 20s}\nkafka: {brokers: [k:1]}\n", "receive_timeout"},
		// Issue 24: nothing routes into the checkpoint topic, and numbers have bounds.
		{"events into the checkpoint topic", base + "tables: [{name: outbox, topic: outbox-cdc.checkpoints}]\n", `topic "outbox-cdc.checkpoints" is the checkpoint topic`},
		{"events into a name Kafka takes for the checkpoint topic", base + "tables: [{name: outbox, topic: outbox-cdc_checkpoints}]\n", `topic "outbox-cdc_checkpoints" is the checkpoint topic "outbox-cdc.checkpoints"`},
		{"events into a dead-letter topic", base + "tables: [{name: outbox, topic: dl.x}, {name: other, dead_letter_topic: dl_x}]\n", `topic "dl.x" is, to Kafka, public.other's dead_letter_topic`},
		{"dead letters into the checkpoint topic", base + "checkpoint: {topic: cp}\ntables: [{name: outbox, on_invalid: dead-letter, dead_letter_topic: cp}]\n", `dead_letter_topic "cp" is the checkpoint topic`},
		{"max_in_flight overflow", base + "max_in_flight: 99999999999\n", "max_in_flight"},
		{"max_in_flight too large", base + "max_in_flight: 2000000\n", "use at most 1000000"},
		{"max_in_flight_bytes too small", base + "max_in_flight_bytes: 1000\n", "max_in_flight_bytes 1000: use at least 1048576"},
		{"short signing key", base + "checkpoint: {signing_key_file: " + shortKeyFile + "}\n", "use at least 32"},
		// Issue 47: retention deletes on what it reads back, which must be signed.
		{"retention unsigned", base + "tables: [{name: outbox, retention: {after: 24h}}]\n", "public.outbox: retention deletes rows on what the connector reads back from the checkpoint topic, which must then be signed: set checkpoint.signing_key_file"},
		{"statement timeout", base + "backfill: {statement_timeout: 10ms}\n", "backfill.statement_timeout 10ms"},
		{"unknown order", base + "backfill: {on_unknown_order: guess}\n", `backfill.on_unknown_order "guess": use stop or send`},
		{"negative duration", base + "shutdown_timeout: -5s\n", `shutdown_timeout (line 3): "-5s" is negative`},
		{"broker without a port", "postgres: {url: 'postgres://u@h/d'}\nkafka: {brokers: [kafka-1]}\n", `kafka.brokers: "kafka-1" is not host:port`},
		{"broker port", "postgres: {url: 'postgres://u@h/d'}\nkafka: {brokers: ['k:99999']}\n", `port "99999" is not a number from 1 to 65535`},
		{"listen", base + "http: {listen: 'localhost'}\n", `http.listen "localhost" is not host:port`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := validConfig(writeConfig(t, tt.body), env())
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want it to mention %q", err, tt.want)
			}
			if msg := err.Error(); strings.Contains(msg, "\n") || strings.Contains(msg, "struct {") {
				t.Fatalf("err = %q: want one line, without Go types", msg)
			}
		})
	}
}

func TestLoadConfigRouting(t *testing.T) {
	p := writeConfig(t, `
postgres: {url: 'postgres://u@h/d'}
kafka: {brokers: [k:1]}
tables:
  - name: command_outbox
    columns: {aggregate_type: null, aggregate_id: "", event_type: command_type}
    topic: commands
    key: "{column:correlation_key}"
    format: cloudevents-structured
    tombstone_on_empty_payload: true
    on_invalid: dead-letter
    dead_letter_topic: commands.dlq
  - message_prefix: outbox
    columns: {id: eventId}
    additional: [{column: group_id, placement: header, as: x-group-id}]
    headers: {id: x-event-id, commit_lsn: ""}
`)
	cfg, _, err := validConfig(p, env())
	if err != nil {
		t.Fatal(err)
	}
	c := cfg.Tables[0]
	if c.Columns[outbox.FieldAggregateType] != "" || c.Columns[outbox.FieldAggregateID] != "" || c.Columns[outbox.FieldEventType] != "command_type" ||
		c.Topic != "commands" || c.Format != outbox.FormatCloudEventsStructured || !c.Tombstone || c.OnInvalid != outbox.OnInvalidDeadLetter ||
		c.DeadLetterTopic != "commands.dlq" || len(c.Extra) != 1 || c.Extra[0] != "correlation_key" {
		t.Errorf("tables[0] = %+v", c)
	}
	m := cfg.Tables[1]
	if !m.IsMessage() || m.Columns[outbox.FieldID] != "eventId" || m.Columns[outbox.FieldPayload] != "payload" ||
		m.Headers["id"] != "x-event-id" || m.Headers["commit_lsn"] != "" || m.Additional[0].As != "x-group-id" || !cfg.Postgres.Messages {
		t.Errorf("tables[1] = %+v, messages %v", m, cfg.Postgres.Messages)
	}
}

func TestURLPasswordNeverInErrors(t *testing.T) {
	_, _, err := validConfig("", env("CDC_POSTGRES_URL", "postgres://u:hunter2@h:notaport/d", "CDC_KAFKA_BROKERS", "k:1"))
	if err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("err = %v; want an error without the password", err)
	}
}

// TestZeroDuration: a bare 0 is a duration, as docs/config.md writes it
// (max_batch_delay: 0 turns batching off); YAML alone would refuse it.
func TestZeroDuration(t *testing.T) {
	cfg, _, err := validConfig(writeConfig(t, "postgres: {url: 'postgres://u@h/d'}\nkafka: {brokers: [k:1], max_batch_delay: 0}\nshutdown_timeout: 0\n"), env())
	if err != nil {
		t.Fatal(err)
	}
	if d := cfg.Kafka.MaxBatchDelay.Or(time.Hour); d != 0 {
		t.Errorf("max_batch_delay: 0 gave %v; want 0, batching off", d)
	}
}

// TestReadBatch: postgres.read_batch is 1ms unless set, 0 turns it off,
// the environment sets it, and more than 10ms is refused by name.
func TestReadBatch(t *testing.T) {
	for _, tt := range []struct {
		yaml, env string
		want      time.Duration
		err       string
	}{
		{"", "", time.Millisecond, ""},
		{"read_batch: 0", "", 0, ""},
		{"read_batch: 3ms", "", 3 * time.Millisecond, ""},
		{"", "5ms", 5 * time.Millisecond, ""},
		{"read_batch: 20ms", "", 0, "postgres.read_batch 20ms: use a value from 0 (read at once) to 10ms"},
		{"read_batch: -2ms", "", 0, `postgres.read_batch (line 1): "-2ms" is negative`},
	} {
		body := "postgres: {url: 'postgres://u@h/d'}\nkafka: {brokers: [k:1]}\n"
		if tt.yaml != "" {
			body = "postgres: {url: 'postgres://u@h/d', " + tt.yaml + "}\nkafka: {brokers: [k:1]}\n"
		}
		e := env()
		if tt.env != "" {
			e = env("CDC_POSTGRES_READ_BATCH", tt.env)
		}
		cfg, _, err := validConfig(writeConfig(t, body), e)
		switch {
		case tt.err != "":
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("%q: err = %v; want %q", tt.yaml, err, tt.err)
			}
		case err != nil:
			t.Errorf("%q %q: %v", tt.yaml, tt.env, err)
		case cfg.Postgres.ReadBatchDelay() != tt.want:
			t.Errorf("%q %q: read_batch = %v; want %v", tt.yaml, tt.env, cfg.Postgres.ReadBatchDelay(), tt.want)
		}
	}
}

// TestEnvExpansion: ${VAR} and ${VAR:-default} in values come from the
// environment, typed again when unquoted; $${ is a literal; an unset
// variable without a default is an error naming the key.
func TestEnvExpansion(t *testing.T) {
	body := `postgres:
  url: "postgres://cdc:${PGPASSWORD}@${PGHOST:-localhost}:5432/app"
kafka:
  brokers: ["${BROKER}", "other:9092"]
  sasl: {mechanism: PLAIN, username: cdc, password: "${SASL_PASSWORD}"}
  create_topics: ${CREATE_TOPICS:-true}
max_in_flight: ${IN_FLIGHT}
tables:
  - name: outbox
    headers: {tenant: "literal-$${NOT_EXPANDED}"}
`
	cfg, _, err := validConfig(writeConfig(t, body), env("PGPASSWORD", "s3cret", "BROKER", "k1:9092", "SASL_PASSWORD", "sasl-secret",
		"CREATE_TOPICS", "false", "IN_FLIGHT", "123"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Postgres.URL != "postgres://cdc:s3cret@localhost:5432/app" {
		t.Errorf("postgres.url = %q", cfg.Postgres.URL)
	}
	if got := cfg.Kafka.Brokers; len(got) != 2 || got[0] != "k1:9092" || cfg.Kafka.SASL.Password != "sasl-secret" {
		t.Errorf("kafka = %+v", cfg.Kafka)
	}
	if cfg.Kafka.Creates() || cfg.MaxInFlight != 123 {
		t.Errorf("create_topics %v, max_in_flight %d: want false and 123 (typed after expansion)", cfg.Kafka.Creates(), cfg.MaxInFlight)
	}
	if h := cfg.Tables[0].Headers["tenant"]; h != "literal-${NOT_EXPANDED}" {
		t.Errorf("headers.tenant = %q; want $${ kept as a literal ${", h)
	}

	for _, tc := range []struct{ body, want string }{
		{"postgres: {url: '${NOPE}'}\nkafka: {brokers: [k:1]}\n", "postgres.url (line 1): ${NOPE} is not set: set it, or give a default as ${NOPE:-value}"},
		{"postgres: {url: 'x${A'}\nkafka: {brokers: [k:1]}\n", "postgres.url (line 1): a ${ without its }"},
		{"postgres: {url: '${A-B}'}\nkafka: {brokers: [k:1]}\n", "is not an environment variable name"},
	} {
		_, _, err := validConfig(writeConfig(t, tc.body), noEnv)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: err = %v; want %q", tc.body, err, tc.want)
		}
	}
}

func TestReconnectBackoff(t *testing.T) {
	cfg, _, err := validConfig(writeConfig(t, "postgres: {url: 'postgres://u@h/d'}\nkafka: {brokers: [k:1]}\nreconnect: {backoff: 250ms, backoff_max: 2m}\n"), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.RetryBackoff != 250*time.Millisecond || cfg.RetryBackoffMax != 2*time.Minute {
		t.Errorf("backoff %v, max %v; want 250ms and 2m", cfg.RetryBackoff, cfg.RetryBackoffMax)
	}
	cfg, _, err = validConfig(writeConfig(t, "postgres: {url: 'postgres://u@h/d'}\nkafka: {brokers: [k:1]}\nreconnect: {backoff: 1m}\n"), noEnv)
	if err != nil || cfg.RetryBackoffMax != time.Minute {
		t.Errorf("backoff 1m alone: max %v, err %v; want the max raised to 1m", cfg.RetryBackoffMax, err)
	}
}

// TestEverySettingFromTheEnvironment: each key outside tables has a
// CDC_<KEY> variable that overrides the file, typed like the key; a bad
// value names the variable.
func TestEverySettingFromTheEnvironment(t *testing.T) {
	var names []string
	envKeys(reflect.TypeOf(fileConfig{}), nil, func(name string, _ []string, _ reflect.Type) { names = append(names, name) })
	for _, want := range []string{"CDC_POSTGRES_URL", "CDC_POSTGRES_CONFIRM_INTERVAL", "CDC_KAFKA_BROKERS", "CDC_KAFKA_MAX_BATCH_DELAY",
		"CDC_KAFKA_TOPIC_DEFAULTS_PARTITIONS", "CDC_KAFKA_TLS_CA_FILE", "CDC_KAFKA_SASL_PASSWORD", "CDC_CHECKPOINT_TOPIC", "CDC_REPLAY_WINDOW",
		"CDC_MAX_IN_FLIGHT", "CDC_LOG_KAFKA", "CDC_HTTP_TOKEN_FILE", "CDC_RECONNECT_BACKOFF_MAX",
		"CDC_CHECKPOINT_SIGNING_KEY_FILE", "CDC_MAX_IN_FLIGHT_BYTES", "CDC_BACKFILL_STATEMENT_TIMEOUT", "CDC_HTTP_UNHEALTHY_AFTER"} {
		if !slices.Contains(names, want) {
			t.Errorf("no %s among the variables %v", want, names)
		}
	}
	for _, n := range names {
		if strings.HasPrefix(n, "CDC_TABLES") {
			t.Errorf("%s: tables have no variables", n)
		}
	}

	file := writeConfig(t, "postgres: {url: 'postgres://file@h/d', slot: from_file}\nkafka: {brokers: [file:1], create_topics: true}\nmax_in_flight: 10\n")
	cfg, lc, err := validConfig(file, env("CDC_KAFKA_BROKERS", "a:1, b:2", "CDC_KAFKA_MAX_BATCH_DELAY", "0", "CDC_MAX_IN_FLIGHT", "77",
		"CDC_KAFKA_CREATE_TOPICS", "false", "CDC_KAFKA_TOPIC_DEFAULTS_PARTITIONS", "6", "CDC_REPLAY_WINDOW", "2h", "CDC_LOG_KAFKA", "warn",
		"CDC_POSTGRES_CONFIRM_INTERVAL", "50ms", "CDC_KAFKA_CLIENT_ID", "0123", "CDC_HTTP_LISTEN", "127.0.0.1:9999"))
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Kafka.Brokers; len(got) != 2 || got[0] != "a:1" || got[1] != "b:2" {
		t.Errorf("brokers = %v", got)
	}
	if cfg.Kafka.MaxBatchDelay.Or(time.Hour) != 0 || cfg.MaxInFlight != 77 || cfg.Kafka.Creates() || cfg.Kafka.TopicDefaults.Partitions != 6 ||
		cfg.Replay.Window != 2*time.Hour || cfg.Kafka.ClientLog != "warn" || cfg.Postgres.ConfirmInterval != 50*time.Millisecond ||
		cfg.Kafka.ClientID != "0123" || lc.HTTP.Listen != "127.0.0.1:9999" {
		t.Errorf("the environment did not override the file: %+v", cfg)
	}
	if cfg.Postgres.Slot != "from_file" || cfg.Postgres.URL != "postgres://file@h/d" {
		t.Errorf("keys without a variable set must keep the file's values: %+v", cfg.Postgres)
	}

	_, _, err = validConfig(file, env("CDC_MAX_IN_FLIGHT", "lots"))
	if err == nil || !strings.Contains(err.Error(), `max_in_flight (from CDC_MAX_IN_FLIGHT): "lots" is not a whole number`) {
		t.Errorf("a bad variable: %v; want it named", err)
	}
	// Without a file, the environment alone.
	cfg, _, err = validConfig("", env("CDC_POSTGRES_URL", "postgres://u@h/d", "CDC_KAFKA_BROKERS", "k:1", "CDC_POSTGRES_SLOT", "env_slot"))
	if err != nil || cfg.Postgres.Slot != "env_slot" {
		t.Errorf("no file: slot %q, err %v", cfg.Postgres.Slot, err)
	}
}

// TestMalformedURLHidesThePassword: a URL that does not parse says so, and
// what is wrong, without the password in it.
func TestMalformedURLHidesThePassword(t *testing.T) {
	for url, what := range map[string]string{
		"postgres://u:s3cr3t@h:notaport/d":          "invalid port",
		"postgres://u:s3cr3t@h/d?sslmode=sometimes": "sslmode is invalid",
		"host=h password=s3cr3t port=x":             "invalid port",
	} {
		_, _, err := validConfig(writeConfig(t, fmt.Sprintf("postgres: {url: %q}\nkafka: {brokers: [k:1]}\n", url)), noEnv)
		if err == nil || !strings.Contains(err.Error(), "postgres.url does not parse: ") || !strings.Contains(err.Error(), what) ||
			strings.Contains(err.Error(), "s3cr3t") || strings.Contains(err.Error(), "\n") {
			t.Errorf("url %q: err = %v; want one line saying it does not parse (%s), without the password", url, err, what)
		}
	}
}

// TestSchemaSetting: tables[].schema takes the short form (schema: avro)
// and the mapping, fills its defaults, and refuses what cannot work with
// one line naming the key; the registry's password comes from the
// environment and no error shows it.
func TestSchemaSetting(t *testing.T) {
	base := "postgres: {url: 'postgres://u@h/d'}\nkafka: {brokers: [k:1]}\nschema_registry: {url: 'http://registry:8081'}\n"
	cfg, _, err := validConfig(writeConfig(t, base+"tables: [{name: outbox, schema: avro}]\n"), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	want := outbox.Schema{Format: outbox.SchemaAvro, Subject: outbox.SubjectTopic, IDIn: outbox.IDInPrefix}
	if got := cfg.Tables[0].Schema; got != want {
		t.Fatalf("schema: avro = %+v, want %+v", got, want)
	}
	cfg, _, err = validConfig(writeConfig(t, base+"tables: [{name: outbox, schema: {format: json-schema, subject: topic-record, version: 3, id_in: header, key: true}}]\n"), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	want = outbox.Schema{Format: outbox.SchemaJSONSchema, Subject: outbox.SubjectTopicRecord, Version: 3, IDIn: outbox.IDInHeader, Key: true}
	if got := cfg.Tables[0].Schema; got != want {
		t.Fatalf("schema mapping = %+v, want %+v", got, want)
	}
	if cfg, _, err := validConfig(writeConfig(t, base+"tables: [{name: outbox}]\n"), noEnv); err != nil || cfg.Tables[0].Schema.Format != outbox.SchemaJSON || cfg.UsesRegistry() {
		t.Fatalf("no schema: %+v, %v; want json without the registry", cfg.Tables, err)
	}
	noRegistry := "postgres: {url: 'postgres://u@h/d'}\nkafka: {brokers: [k:1]}\n"
	for _, tt := range []struct{ body, want string }{
		{noRegistry + "tables: [{name: outbox, schema: avro}]\n", "needs schema_registry.url"},
		{base + "tables: [{name: outbox, schema: {formt: avro}}]\n", "unknown key tables[0].schema.formt (line 4); did you mean format?"},
		{base + "tables: [{name: outbox, schema: xml}]\n", `schema "xml": use json, json-schema, avro or protobuf`},
		{base + "tables: [{name: outbox, schema: {format: avro, id_in: header}}]\n", "schema.id_in header keeps the value's bytes as written, which only json-schema does"},
		{base + "tables: [{name: outbox, schema: {format: avro, version: newest}}]\n", `schema.version "newest": use latest or a version number`},
		{base + "tables: [{name: outbox, schema: {format: avro, subject: record}, columns: {event_type: null}}]\n", "map the event_type field"},
		{base + "tables: [{name: outbox, schema: avro, format: envelope}]\n", "use format payload or cloudevents-binary"},
		{base + "tables: [{name: outbox, schema: {format: protobuf, key: true}}]\n", "use key: false"},
		{base + "tables: [{name: outbox, schema: {format: json, version: 2}}]\n", "schema format json takes no other schema settings"},
		{base + "tables: [{name: outbox, schema: {format: avro, subject: record, file: x.avsc}}]\n", "schema.file is one schema, and schema.subject record names a subject per event type"},
		{"postgres: {url: 'postgres://u@h/d'}\nkafka: {brokers: [k:1]}\nschema_registry: {url: 'http://cdc:hunter2@registry:8081'}\ntables: [{name: outbox, schema: avro}]\n", "move them to schema_registry.basic_auth"},
		{noRegistry + "schema_registry: {url: 'registry:8081'}\n", "schema_registry.url: use an http:// or https:// URL"},
		{"postgres: {url: 'postgres://u@h/d'}\nkafka: {brokers: [k:1]}\nschema_registry: {url: 'http://r:8081', basic_auth: {username: cdc}}\n", "needs a password: basic_auth.password_file, or CDC_SCHEMA_REGISTRY_BASIC_AUTH_PASSWORD"},
	} {
		_, _, err := validConfig(writeConfig(t, tt.body), noEnv)
		if err == nil || !strings.Contains(err.Error(), tt.want) || strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: err = %v; want one line saying %q", tt.body, err, tt.want)
		}
	}
	// schema.file, which auto_register registers, must compile.
	dir := t.TempDir()
	good, bad := filepath.Join(dir, "good.avsc"), filepath.Join(dir, "bad.avsc")
	if err := os.WriteFile(good, []byte(`{"type":"record","name":"O","fields":[{"name":"id","type":"string"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, []byte(`{"type":"record"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := validConfig(writeConfig(t, base+"tables: [{name: outbox, schema: {format: avro, file: '"+good+"'}}]\n"), noEnv); err != nil {
		t.Fatalf("a schema file that compiles: %v", err)
	}
	if _, _, err := validConfig(writeConfig(t, base+"tables: [{name: outbox, schema: {format: avro, file: '"+bad+"'}}]\n"), noEnv); err == nil || !strings.Contains(err.Error(), "bad.avsc does not compile as avro") {
		t.Fatalf("a schema file that does not compile: %v", err)
	}
	cfg, _, err = validConfig(writeConfig(t, "postgres: {url: 'postgres://u@h/d'}\nkafka: {brokers: [k:1]}\nschema_registry: {url: 'http://r:8081', basic_auth: {username: cdc}}\n"),
		env("CDC_SCHEMA_REGISTRY_BASIC_AUTH_PASSWORD", "hunter2"))
	if err != nil || cfg.SchemaRegistry.Password != "hunter2" {
		t.Fatalf("password from the environment: %q, %v", cfg.SchemaRegistry.Password, err)
	}
}

// TestProducer: the producer's settings are kafka.* with what the other
// stages decide (the delivery mode and its transaction timeout, a buffer
// above max_in_flight, the dead-letter topics' limit), and Validate
// rewrites nothing of kafka.* itself.
func TestProducer(t *testing.T) {
	yaml := "postgres: {url: 'postgres://u@h/d'}\ndelivery: exactly-once\nexactly_once: {transaction_timeout: 2m}\nmax_in_flight: 300\n" +
		"kafka: {brokers: [k:1], dead_letter_max_message_bytes: 3000000}\ntables: [{name: public.outbox, on_invalid: dead-letter, dead_letter_topic: dl}]\n"
	cfg, _, err := validConfig(writeConfig(t, yaml), env())
	if err != nil {
		t.Fatal(err)
	}
	p := cfg.Producer()
	if !p.ExactlyOnce || p.TransactionTimeout != 2*time.Minute || p.MaxBufferedRecords != 600 || p.TopicMaxMessageBytes["dl"] != 3_000_000 {
		t.Errorf("producer: exactly once %v, transaction timeout %s, buffer %d, dead-letter limit %d; want true, 2m, 600, 3000000",
			p.ExactlyOnce, p.TransactionTimeout, p.MaxBufferedRecords, p.TopicMaxMessageBytes["dl"])
	}
	// A fail table's dead-letter topic too: cdc skip sends there the event
	// it stopped on, one too large for its topic included.
	fail, _, err := validConfig(writeConfig(t, "postgres: {url: 'postgres://u@h/d'}\nkafka: {brokers: [k:1], dead_letter_max_message_bytes: 3000000}\ntables: [{name: public.outbox, dead_letter_topic: dl}]\n"), env())
	if err != nil {
		t.Fatal(err)
	}
	if n := fail.Producer().TopicMaxMessageBytes["dl"]; n != 3_000_000 {
		t.Errorf("on_invalid: fail: dead-letter limit %d; want 3000000 (cdc skip sends there)", n)
	}
	if cfg.Kafka.ExactlyOnce || cfg.Kafka.TransactionTimeout != 0 || cfg.Kafka.TopicMaxMessageBytes != nil {
		t.Errorf("Validate rewrote kafka.*: %+v", cfg.Kafka)
	}
	if r := cfg.Registry(); r.WaitLimit != time.Minute || cfg.SchemaRegistry.WaitLimit != 0 {
		t.Errorf("registry wait limit %s (config's %s); want half the transaction timeout, and the config's untouched", r.WaitLimit, cfg.SchemaRegistry.WaitLimit)
	}
}

// TestSecretFileWeaknesses (issue 37): a secret file any user of the host
// may read is named a weakness (cdc run logs it, cdc check lists it); one
// readable by its owner and group (a Kubernetes Secret with fsGroup) is
// not.
func TestSecretFileWeaknesses(t *testing.T) {
	dir := t.TempDir()
	key := filepath.Join(dir, "signing.key")
	if err := os.WriteFile(key, []byte("0123456789abcdef0123456789abcdef\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Chmod(key, 0o644) // whatever the umask
	path := filepath.Join(dir, "cdc.yaml")
	os.WriteFile(path, []byte("postgres: {url: 'postgres://u@h/d'}\nkafka: {brokers: [k:1]}\ncheckpoint: {signing_key_file: "+key+"}\n"), 0o600)
	_, lc, err := Load(path, Map())
	if err != nil {
		t.Fatal(err)
	}
	if ws := lc.Weaknesses(); len(ws) != 1 || !strings.Contains(ws[0], "chmod o-rwx "+key) {
		t.Fatalf("weaknesses %q; want the world-readable key named", ws)
	}
	os.Chmod(key, 0o440)
	if ws := lc.Weaknesses(); len(ws) != 0 {
		t.Fatalf("weaknesses %q with mode 0440", ws)
	}
}
