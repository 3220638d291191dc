package main

import (
	"bytes"
	"context"
	neturl "net/url"
	"os"
	"strings"
	"testing"

	"github.com/outboxcdc/cdc/internal/config"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// docker-compose.yml itself is loaded and checked by compose-spec's own
// loader in deploy/check (TestComposeFile); this is what needs a Postgres.

// TestComposeSQLGivesLeastPrivilege: docker/init.sql runs on a real
// Postgres, and the role it creates for the connector, which is the one
// docker/cdc.yaml uses, is not a superuser yet passes cdc check.
func TestComposeSQLGivesLeastPrivilege(t *testing.T) {
	testenv.Require(t, pg)
	srv, err := testenv.StartPostgres() // a server of its own: init.sql creates a role
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	db := srv.NewDatabase(t)
	init, err := os.ReadFile("../../docker/init.sql")
	if err != nil {
		t.Fatal(err)
	}
	testenv.Exec(t, db, string(init))
	var super bool
	testenv.QueryRow(t, db, `SELECT rolsuper FROM pg_roles WHERE rolname = 'cdc'`, nil, &super)
	if super {
		t.Fatal("init.sql makes the connector's role a superuser")
	}
	file, _, err := config.Load("../../docker/cdc.yaml", noEnv)
	if err != nil {
		t.Fatal(err)
	}
	composeURL, _ := neturl.Parse(file.Postgres.URL)
	u, _ := neturl.Parse(db)
	u.User = composeURL.User // cdc:cdc, as the compose connector
	k := testenv.NewKafka(t)
	var out, errOut bytes.Buffer
	code := run(context.Background(), []string{"check", "--config", "../../docker/cdc.yaml"},
		env("CDC_POSTGRES_URL", u.String(), "CDC_KAFKA_BROKERS", strings.Join(k.Brokers, ","), "CDC_CHECKPOINT_TOPIC", k.CheckpointTopic(),
			"CDC_HTTP_LISTEN", ""), &out, &errOut)
	if code != 0 {
		t.Fatalf("cdc check as the compose role: exit %d\n%s%s", code, out.String(), errOut.String())
	}
}
