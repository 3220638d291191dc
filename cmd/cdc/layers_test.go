package main

import (
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestPackageFloors checks every package's imports against the floors of
// docs/design.md ("The pipeline"): a package imports only packages on
// lower floors, so there are no cycles, and the table stays true to the
// code. A package missing from the table fails too.
func TestPackageFloors(t *testing.T) {
	raw, err := os.ReadFile("../../docs/design.md")
	if err != nil {
		t.Fatal(err)
	}
	floor := map[string]int{}
	for _, m := range regexp.MustCompile("(?m)^\\| (\\d+) \\| `([a-z/]+)` \\|").FindAllStringSubmatch(string(raw), -1) {
		n, _ := strconv.Atoi(m[1])
		floor[m[2]] = n
	}
	if len(floor) < 15 {
		t.Fatalf("found %d packages in docs/design.md's floors table: the table or its pattern changed", len(floor))
	}
	const module = "github.com/outboxcdc/cdc/"
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", module+"internal/...", module+"cmd/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		pkg := strings.TrimPrefix(fields[0], module)
		own, ok := floor[pkg]
		if !ok {
			t.Errorf("package %s has no floor in docs/design.md; add it to the table", pkg)
			continue
		}
		for _, imp := range fields[1:] {
			if !strings.HasPrefix(imp, module) {
				continue
			}
			dep := strings.TrimPrefix(imp, module)
			if f, ok := floor[dep]; ok && f >= own {
				t.Errorf("%s (floor %d) imports %s (floor %d): a package imports only lower floors", pkg, own, dep, f)
			}
		}
	}
}
