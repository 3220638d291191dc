package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
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
		} `yaml:"services"`
	}
	if err := yaml.Unmarshal(raw, &compose); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
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
	cfg, _, err := loadConfig("../../docker/cdc.yaml", noEnv)
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
