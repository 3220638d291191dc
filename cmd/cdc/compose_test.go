package main

import (
	"bytes"
	"context"
	"fmt"
	neturl "net/url"
	"os"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/outboxcdc/cdc/internal/config"
	"github.com/outboxcdc/cdc/internal/testenv"
)

// TestComposeConfigValidates: docker-compose.yml mounts docker/cdc.yaml
// into the connector, and that file passes `cdc check --offline`. Docker is
// not available here; this keeps the compose path's config honest.
func TestComposeConfigValidates(t *testing.T) {
	raw, err := os.ReadFile("../../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var compose struct {
		Services map[string]struct {
			Command []string `yaml:"command"`
			Volumes []string `yaml:"volumes"`
			Ports   []string `yaml:"ports"`
		} `yaml:"services"`
	}
	if err := yaml.Unmarshal(raw, &compose); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	// Published on loopback only (issue 24): the example passwords must
	// not be reachable from other machines.
	for name, svc := range compose.Services {
		for _, p := range svc.Ports {
			if !strings.HasPrefix(p, "127.0.0.1:") {
				t.Errorf("service %s publishes %q on every address; publish on 127.0.0.1 only", name, p)
			}
		}
	}
	conn, ok := compose.Services["connector"]
	if !ok {
		t.Fatal("docker-compose.yml has no connector service")
	}
	if strings.Join(conn.Command, " ") != "run --config /etc/cdc/cdc.yaml" {
		t.Fatalf("connector command = %v", conn.Command)
	}
	mounted := false
	for _, v := range conn.Volumes {
		if strings.HasPrefix(v, "./docker/cdc.yaml:/etc/cdc/cdc.yaml") {
			mounted = true
		}
	}
	if !mounted {
		t.Fatalf("connector volumes %v do not mount ./docker/cdc.yaml at /etc/cdc/cdc.yaml", conn.Volumes)
	}
	var out bytes.Buffer
	if code := run(context.Background(), []string{"check", "--offline", "--config", "../../docker/cdc.yaml"}, noEnv, &out, &out); code != 0 {
		t.Fatalf("cdc check --offline docker/cdc.yaml: exit %d\n%s", code, out.String())
	}
	cfg, _, err := config.Load("../../docker/cdc.yaml", noEnv)
	if err != nil {
		t.Fatal(err)
	}
	init, err := os.ReadFile("../../docker/init.sql")
	if err != nil {
		t.Fatal(err)
	}
	for _, tbl := range cfg.Tables {
		if !strings.Contains(string(init), "CREATE TABLE "+tbl.Name.Name+" (") {
			t.Errorf("docker/init.sql does not create the configured table %s", tbl.Name)
		}
	}
}

// TestComposeFromTheHost: the compose file publishes Postgres, Kafka (an
// external listener advertised to the host) and the connector's endpoint;
// the connector's healthcheck asks /readyz with cdc probe; the viewer
// refreshes its topic list, so it sees topics created after it started.
func TestComposeFromTheHost(t *testing.T) {
	raw, err := os.ReadFile("../../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var compose struct {
		Services map[string]struct {
			Ports       []string          `yaml:"ports"`
			Environment map[string]string `yaml:"environment"`
			Command     any               `yaml:"command"`
			Healthcheck struct {
				Test []string `yaml:"test"`
			} `yaml:"healthcheck"`
		} `yaml:"services"`
	}
	if err := yaml.Unmarshal(raw, &compose); err != nil {
		t.Fatal(err)
	}
	s := compose.Services
	for svc, port := range map[string]string{"postgres": ":5432", "kafka": ":9094", "connector": ":9187"} {
		if len(s[svc].Ports) == 0 || !strings.HasSuffix(s[svc].Ports[0], port) {
			t.Errorf("%s publishes %v; want a port mapped to %s", svc, s[svc].Ports, port)
		}
	}
	k := s["kafka"].Environment
	if !strings.Contains(k["KAFKA_LISTENERS"], "EXTERNAL://:9094") || !strings.Contains(k["KAFKA_ADVERTISED_LISTENERS"], "EXTERNAL://localhost:") ||
		!strings.Contains(k["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"], "EXTERNAL:PLAINTEXT") {
		t.Errorf("kafka has no external listener advertised to the host: %v", k)
	}
	if got := strings.Join(s["connector"].Healthcheck.Test, " "); !strings.Contains(got, "cdc probe --ready --addr 127.0.0.1:9187") {
		t.Errorf("connector healthcheck %q; want cdc probe --ready", got)
	}
	if got := fmt.Sprint(s["viewer"].Command); !strings.Contains(got, "metadata.max.age.ms=") {
		t.Errorf("the viewer's consumer keeps its topic list for 5 minutes: %s", got)
	}
}

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
