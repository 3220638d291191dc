package check

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/hashicorp/go-hclog"

	"github.com/outboxcdc/cdc/internal/config"
	"github.com/outboxcdc/cdc/internal/pipeline"
)

// loadCompose loads docker-compose.yml as docker compose does: the
// compose-spec loader, with its schema, interpolation of env, and the
// paths resolved against the repository.
func loadCompose(t *testing.T, env ...string) *types.Project {
	t.Helper()
	opts, err := cli.NewProjectOptions([]string{"../../docker-compose.yml"},
		cli.WithWorkingDirectory("../.."), cli.WithName("outbox-cdc"), cli.WithEnv(env))
	if err != nil {
		t.Fatal(err)
	}
	p, err := opts.LoadProject(context.Background())
	if err != nil {
		t.Fatalf("docker-compose.yml does not load: %v", err)
	}
	return p
}

func service(t *testing.T, p *types.Project, name string) types.ServiceConfig {
	t.Helper()
	s, ok := p.Services[name]
	if !ok {
		t.Fatalf("docker-compose.yml has no %s service", name)
	}
	return s
}

// TestComposeFile: the services start in order (depends_on waits for
// healthy Postgres and Kafka), each has a healthcheck that asks the
// service itself, everything is published on loopback only, and the
// connector runs the config docker/cdc.yaml with the loader cdc run uses.
func TestComposeFile(t *testing.T) {
	p := loadCompose(t)
	for _, name := range []string{"postgres", "kafka", "connector", "writer", "viewer"} {
		service(t, p, name)
	}

	// Published on 127.0.0.1 only (the example passwords must not reach
	// other machines), on the ports the README gives.
	published := map[string]string{}
	for name, s := range p.Services {
		for _, port := range s.Ports {
			if port.HostIP != "127.0.0.1" {
				t.Errorf("service %s publishes %d on %q; publish on 127.0.0.1 only", name, port.Target, port.HostIP)
			}
			published[name] = port.Published + "->" + strconv.Itoa(int(port.Target))
		}
	}
	for name, want := range map[string]string{"postgres": "5432->5432", "kafka": "9094->9094", "connector": "9187->9187"} {
		if published[name] != want {
			t.Errorf("%s publishes %q, want %s", name, published[name], want)
		}
	}

	// Healthchecks, and the order they impose.
	for name, want := range map[string]string{
		"postgres":  "pg_isready",
		"kafka":     "kafka-broker-api-versions.sh --bootstrap-server localhost:9092",
		"connector": "/usr/local/bin/cdc probe --ready --addr 127.0.0.1:9187",
	} {
		hc := service(t, p, name).HealthCheck
		if hc == nil || !strings.Contains(strings.Join(hc.Test, " "), want) || hc.Interval == nil || hc.Retries == nil {
			t.Errorf("%s healthcheck %+v; want one running %q, with an interval and retries", name, hc, want)
		}
	}
	for name, deps := range map[string][]string{"connector": {"postgres", "kafka"}, "writer": {"postgres"}} {
		for _, dep := range deps {
			d, ok := service(t, p, name).DependsOn[dep]
			if !ok || d.Condition != types.ServiceConditionHealthy {
				t.Errorf("%s does not wait for %s to be healthy: %+v", name, dep, service(t, p, name).DependsOn)
			}
		}
	}
	viewer := service(t, p, "viewer")
	if len(viewer.DependsOn) == 0 {
		t.Error("the viewer starts before anything it reads")
	}
	// The viewer refreshes its topic list, so it sees topics the
	// connector creates after it started.
	if cmd := strings.Join(append(viewer.Entrypoint, viewer.Command...), " "); !strings.Contains(cmd, "metadata.max.age.ms=") {
		t.Errorf("the viewer's consumer keeps its topic list for 5 minutes: %s", cmd)
	}

	// Kafka has a listener for the host, advertised as localhost.
	k := service(t, p, "kafka").Environment
	get := func(key string) string {
		if v := k[key]; v != nil {
			return *v
		}
		return ""
	}
	if !strings.Contains(get("KAFKA_LISTENERS"), "EXTERNAL://:9094") || !strings.Contains(get("KAFKA_ADVERTISED_LISTENERS"), "EXTERNAL://localhost:9094") ||
		!strings.Contains(get("KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"), "EXTERNAL:PLAINTEXT") {
		t.Errorf("kafka has no external listener advertised to the host: %v", k)
	}

	// The connector: built from this repository, restarted on failure,
	// running the mounted docker/cdc.yaml.
	c := service(t, p, "connector")
	if c.Build == nil || c.Restart != "on-failure" || strings.Join(c.Command, " ") != "run --config /etc/cdc/cdc.yaml" {
		t.Errorf("connector build %+v, restart %q, command %v", c.Build, c.Restart, c.Command)
	}
	var source string
	for _, v := range c.Volumes {
		if v.Target == "/etc/cdc/cdc.yaml" && v.ReadOnly {
			source = v.Source
		}
	}
	if !strings.HasSuffix(source, "/docker/cdc.yaml") {
		t.Fatalf("the connector does not mount docker/cdc.yaml read-only at /etc/cdc/cdc.yaml: %+v", c.Volumes)
	}
	cfg, lc, err := config.Load(source, config.Map())
	if err != nil {
		t.Fatalf("%s: %v", source, err)
	}
	// As cdc check --offline takes it: validated, and the routing built.
	if _, err := pipeline.New(cfg, hclog.NewNullLogger(), pipeline.Options{}); err != nil {
		t.Fatalf("%s: %v", source, err)
	}
	if lc.HTTP.Listen != "0.0.0.0:9187" {
		t.Errorf("the connector listens on %s; the published port and the healthcheck need 0.0.0.0:9187", lc.HTTP.Listen)
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

// TestComposePortsMove: CDC_PG_PORT, CDC_KAFKA_PORT and CDC_HTTP_PORT move
// the published ports, and Kafka advertises the moved one to the host.
func TestComposePortsMove(t *testing.T) {
	p := loadCompose(t, "CDC_PG_PORT=15432", "CDC_KAFKA_PORT=19094", "CDC_HTTP_PORT=19187")
	for name, want := range map[string]string{"postgres": "15432", "kafka": "19094", "connector": "19187"} {
		if ports := service(t, p, name).Ports; len(ports) != 1 || ports[0].Published != want {
			t.Errorf("%s publishes %+v, want %s", name, ports, want)
		}
	}
	if v := service(t, p, "kafka").Environment["KAFKA_ADVERTISED_LISTENERS"]; v == nil || !strings.Contains(*v, "EXTERNAL://localhost:19094") {
		t.Errorf("kafka advertises %v to the host, want localhost:19094", v)
	}
}
