package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/pipeline"
	"github.com/outboxcdc/cdc/internal/sink"
	"github.com/outboxcdc/cdc/internal/wal"
)

// fileConfig is the YAML file format. docs/config.md documents every key;
// keep the two in step.
type fileConfig struct {
	Postgres struct {
		URL            string        `yaml:"url"`
		Slot           string        `yaml:"slot"`
		Publication    string        `yaml:"publication"`
		StatusInterval time.Duration `yaml:"status_interval"`
	} `yaml:"postgres"`
	Kafka struct {
		Brokers                []string      `yaml:"brokers"`
		ClientID               string        `yaml:"client_id"`
		MaxMessageBytes        int32         `yaml:"max_message_bytes"`
		AllowAutoTopicCreation *bool         `yaml:"allow_auto_topic_creation"`
		Linger                 time.Duration `yaml:"linger"`
	} `yaml:"kafka"`
	Tables []struct {
		Name    string `yaml:"name"`
		Topic   string `yaml:"topic"`
		Columns struct {
			ID            string `yaml:"id"`
			AggregateType string `yaml:"aggregate_type"`
			AggregateID   string `yaml:"aggregate_id"`
			Type          string `yaml:"type"`
			Payload       string `yaml:"payload"`
		} `yaml:"columns"`
	} `yaml:"tables"`
	MaxInFlight     int           `yaml:"max_in_flight"`
	ShutdownTimeout time.Duration `yaml:"shutdown_timeout"`
	Log             struct {
		Level  string `yaml:"level"`
		Format string `yaml:"format"`
	} `yaml:"log"`
}

// logConfig is how the process logs.
type logConfig struct {
	Level string // trace, debug, info (default), warn, error
	JSON  bool
}

// loadConfig reads the YAML file at path ("" for none), applies the
// environment (CDC_POSTGRES_URL, CDC_KAFKA_BROKERS, CDC_LOG_LEVEL,
// CDC_LOG_FORMAT override the file), fills defaults and validates.
func loadConfig(path string, getenv func(string) string) (pipeline.Config, logConfig, error) {
	var fc fileConfig
	if path != "" {
		raw, err := os.ReadFile(path)
		if err != nil {
			return pipeline.Config{}, logConfig{}, fmt.Errorf("read config: %w", err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(raw))
		dec.KnownFields(true)
		if err := dec.Decode(&fc); err != nil && !errors.Is(err, io.EOF) {
			return pipeline.Config{}, logConfig{}, fmt.Errorf("config %s: %w (see docs/config.md for the keys)", path, err)
		}
	}
	if v := getenv("CDC_POSTGRES_URL"); v != "" {
		fc.Postgres.URL = v
	}
	if v := getenv("CDC_KAFKA_BROKERS"); v != "" {
		fc.Kafka.Brokers = nil
		for _, b := range strings.Split(v, ",") {
			if b = strings.TrimSpace(b); b != "" {
				fc.Kafka.Brokers = append(fc.Kafka.Brokers, b)
			}
		}
	}
	if v := getenv("CDC_LOG_LEVEL"); v != "" {
		fc.Log.Level = v
	}
	if v := getenv("CDC_LOG_FORMAT"); v != "" {
		fc.Log.Format = v
	}

	lc := logConfig{Level: strings.ToLower(fc.Log.Level)}
	if lc.Level == "" {
		lc.Level = "info"
	}
	switch lc.Level {
	case "trace", "debug", "info", "warn", "error":
	default:
		return pipeline.Config{}, logConfig{}, fmt.Errorf("log.level %q: use trace, debug, info, warn or error", fc.Log.Level)
	}
	switch fc.Log.Format {
	case "", "text":
	case "json":
		lc.JSON = true
	default:
		return pipeline.Config{}, logConfig{}, fmt.Errorf("log.format %q: use text or json", fc.Log.Format)
	}

	autoCreate := true
	if fc.Kafka.AllowAutoTopicCreation != nil {
		autoCreate = *fc.Kafka.AllowAutoTopicCreation
	}
	cfg := pipeline.Config{
		Postgres: wal.Config{
			URL:            fc.Postgres.URL,
			Slot:           fc.Postgres.Slot,
			Publication:    fc.Postgres.Publication,
			StatusInterval: fc.Postgres.StatusInterval,
		},
		Kafka: sink.Config{
			Brokers:                fc.Kafka.Brokers,
			ClientID:               fc.Kafka.ClientID,
			MaxMessageBytes:        fc.Kafka.MaxMessageBytes,
			AllowAutoTopicCreation: autoCreate,
			Linger:                 fc.Kafka.Linger,
		},
		MaxInFlight:     fc.MaxInFlight,
		ShutdownTimeout: fc.ShutdownTimeout,
	}
	if len(fc.Tables) == 0 {
		// Debezium's default layout, so that a config-less start works.
		cfg.Tables = []*outbox.Table{{Name: outbox.TableName{Schema: "public", Name: "outbox"}, Columns: outbox.DefaultColumns, Topic: outbox.DefaultTopic}}
	}
	for i, ft := range fc.Tables {
		name, err := outbox.ParseTableName(ft.Name)
		if err != nil {
			return pipeline.Config{}, logConfig{}, fmt.Errorf("tables[%d].name: %w", i, err)
		}
		t := &outbox.Table{Name: name, Topic: ft.Topic, Columns: outbox.DefaultColumns}
		if t.Topic == "" {
			t.Topic = outbox.DefaultTopic
		}
		for _, c := range []struct {
			key  string
			val  string
			dest *string
		}{
			{"id", ft.Columns.ID, &t.Columns.ID},
			{"aggregate_type", ft.Columns.AggregateType, &t.Columns.AggregateType},
			{"aggregate_id", ft.Columns.AggregateID, &t.Columns.AggregateID},
			{"type", ft.Columns.Type, &t.Columns.Type},
			{"payload", ft.Columns.Payload, &t.Columns.Payload},
		} {
			if c.val == "" {
				continue
			}
			id, err := outbox.ParseIdent(c.val)
			if err != nil {
				return pipeline.Config{}, logConfig{}, fmt.Errorf("tables[%d].columns.%s: %w", i, c.key, err)
			}
			*c.dest = id
		}
		cfg.Tables = append(cfg.Tables, t)
	}
	if err := cfg.Validate(); err != nil {
		return pipeline.Config{}, logConfig{}, err
	}
	return cfg, lc, nil
}
