package main

import (
	"os"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// TestReleaseConfig: .goreleaser.yaml builds cmd/cdc for linux and darwin
// on amd64 and arm64 with the version stamped as cdc version reads it, and
// a multi-arch image from the release Dockerfile; go.mod has nothing that
// would break go install .../cmd/cdc@latest. goreleaser itself is not here
// to run `goreleaser check`.
func TestReleaseConfig(t *testing.T) {
	raw, err := os.ReadFile("../../.goreleaser.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var rel struct {
		Version int `yaml:"version"`
		Builds  []struct {
			Main    string   `yaml:"main"`
			Binary  string   `yaml:"binary"`
			Env     []string `yaml:"env"`
			Goos    []string `yaml:"goos"`
			Goarch  []string `yaml:"goarch"`
			Ldflags []string `yaml:"ldflags"`
		} `yaml:"builds"`
		Dockers []struct {
			Goarch     string   `yaml:"goarch"`
			Dockerfile string   `yaml:"dockerfile"`
			Images     []string `yaml:"image_templates"`
		} `yaml:"dockers"`
		Manifests []struct {
			Images []string `yaml:"image_templates"`
		} `yaml:"docker_manifests"`
		SBOMs []struct {
			Artifacts string `yaml:"artifacts"`
		} `yaml:"sboms"`
		Signs []struct {
			Cmd       string `yaml:"cmd"`
			Artifacts string `yaml:"artifacts"`
		} `yaml:"signs"`
	}
	if err := yaml.Unmarshal(raw, &rel); err != nil {
		t.Fatalf(".goreleaser.yaml: %v", err)
	}
	// Issue 24: an SBOM of each archive, and signed checksums.
	if len(rel.SBOMs) != 1 || rel.SBOMs[0].Artifacts != "archive" {
		t.Errorf(".goreleaser.yaml: sboms %+v; want one of the archives", rel.SBOMs)
	}
	if len(rel.Signs) != 1 || rel.Signs[0].Cmd != "cosign" || rel.Signs[0].Artifacts != "checksum" {
		t.Errorf(".goreleaser.yaml: signs %+v; want cosign over the checksums", rel.Signs)
	}
	if rel.Version != 2 || len(rel.Builds) != 1 {
		t.Fatalf(".goreleaser.yaml: version %d, %d builds; want version 2 and one build", rel.Version, len(rel.Builds))
	}
	b := rel.Builds[0]
	for _, want := range [][]string{{"linux", "darwin"}, {"amd64", "arm64"}} {
		got := b.Goos
		if want[0] == "amd64" {
			got = b.Goarch
		}
		for _, w := range want {
			if !slices.Contains(got, w) {
				t.Errorf("the build lacks %s (goos %v, goarch %v)", w, b.Goos, b.Goarch)
			}
		}
	}
	if b.Main != "./cmd/cdc" || b.Binary != "cdc" || !slices.Contains(b.Env, "CGO_ENABLED=0") ||
		len(b.Ldflags) != 1 || !strings.Contains(b.Ldflags[0], "-X main.version=v{{ .Version }}") {
		t.Errorf("build = %+v; want ./cmd/cdc as a static cdc with main.version stamped", b)
	}
	arches := map[string]bool{}
	for _, d := range rel.Dockers {
		arches[d.Goarch] = true
		df, err := os.ReadFile("../../" + d.Dockerfile)
		if err != nil || !strings.Contains(string(df), "COPY cdc /usr/local/bin/cdc") {
			t.Errorf("%s: %v; want it to copy the built cdc", d.Dockerfile, err)
		}
	}
	if !arches["amd64"] || !arches["arm64"] || len(rel.Manifests) == 0 || len(rel.Manifests[0].Images) != 2 {
		t.Errorf("images for %v, manifests %+v; want amd64 and arm64 under one manifest", arches, rel.Manifests)
	}

	mod, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(mod), "module github.com/outboxcdc/cdc\n") {
		t.Errorf("go.mod's module path is not github.com/outboxcdc/cdc")
	}
	for _, l := range strings.Split(string(mod), "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "replace") {
			t.Errorf("go.mod has %q: go install ...@latest ignores replace directives and would build something else", l)
		}
	}
}
