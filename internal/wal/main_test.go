package wal_test

import (
	"context"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/jackc/pglogrepl"

	"github.com/outboxcdc/cdc/internal/outbox"
	"github.com/outboxcdc/cdc/internal/postgres"
	"github.com/outboxcdc/cdc/internal/setup"
	"github.com/outboxcdc/cdc/internal/testenv"
	"github.com/outboxcdc/cdc/internal/wal"
)

var pg *testenv.Postgres

func TestMain(m *testing.M) { testenv.Main(m, &pg) }

// slotted is a new database with an outbox table, its publication and a slot: what
// a stream starts from. It returns the database's URL, a validated config
// for it and the slot's position.
func slotted(t *testing.T) (db string, c postgres.Config, at pglogrepl.LSN) {
	t.Helper()
	db = testenv.Require(t, pg).NewDatabase(t)
	testenv.Exec(t, db, `CREATE TABLE outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), aggregatetype text NOT NULL,
		aggregateid text NOT NULL, type text NOT NULL, payload jsonb)`)
	c = postgres.Config{URL: db}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Setup makes the publication, as the connector does.
	table := setup.Table{TableName: outbox.TableName{Schema: "public", Name: "outbox"}, Columns: []string{"id", "aggregatetype", "aggregateid", "type", "payload"}}
	if _, _, err := setup.Prepare(ctx, c, []setup.Table{table}, hclog.NewNullLogger()); err != nil {
		t.Fatal(err)
	}
	conn, err := wal.Connect(ctx, c, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	at, err = conn.CreateSlot(ctx, c.Slot)
	if err != nil {
		t.Fatal(err)
	}
	return db, c, at
}
