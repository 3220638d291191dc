package config

import (
	"testing"

	"github.com/outboxcdc/cdc/internal/outbox"
)

// TestValidateLeavesCallersTablesAlone: validation fills defaults into
// copies of the tables. A pipeline built on a config another pipeline is
// already running with (a replay next to the stream) must not write the
// tables that one reads; the race detector caught it in
// TestReplayWindowAdvancesAndRefusesOlder.
func TestValidateLeavesCallersTablesAlone(t *testing.T) {
	shared := &outbox.Source{Name: outbox.TableName{Schema: "public", Name: "outbox"}, Columns: outbox.DefaultColumns,
		Additional: []outbox.Additional{{Column: "tenant", Placement: outbox.PlaceHeader}}}
	cfg := Config{Tables: []*outbox.Source{shared}}
	cfg.Postgres.URL = "postgres://u@h/d"
	cfg.Kafka.Brokers = []string{"k:1"}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if cfg.Tables[0] == shared {
		t.Fatal("Validate kept the caller's table")
	}
	if shared.Topic != "" || shared.Extra != nil || shared.Additional[0].As != "" {
		t.Fatalf("Validate wrote the caller's table: %+v", shared)
	}
	if got := cfg.Tables[0]; got.Topic != outbox.DefaultTopic || got.Additional[0].As != "tenant" || len(got.Extra) != 1 {
		t.Fatalf("validated table = %+v", got)
	}
}
