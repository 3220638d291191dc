package main

import (
	"bytes"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
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

// Size limits (docs/design.md, "The pipeline"): a package that grows past
// maxPackageLines has started to gather more than one concept, and a
// function past maxFuncLines more than one step; either is split, not
// the limit raised.
const (
	maxPackageLines = 1600
	maxFuncLines    = 80
)

// TestPackageSizes holds every package of the module to maxPackageLines
// lines of non-test Go, and every function outside tests to maxFuncLines.
func TestPackageSizes(t *testing.T) {
	lines := map[string]int{}
	fset := token.NewFileSet()
	err := filepath.WalkDir("../..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "node_modules" || strings.HasPrefix(d.Name(), ".")) && path != "../.." {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		lines[filepath.Dir(path)] += bytes.Count(src, []byte("\n"))
		f, err := parser.ParseFile(fset, path, src, 0)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			if fn, ok := decl.(*ast.FuncDecl); ok && fn.Body != nil {
				if n := fset.Position(fn.End()).Line - fset.Position(fn.Pos()).Line + 1; n > maxFuncLines {
					t.Errorf("%s: %s is %d lines, more than %d: split it into named steps", path, fn.Name.Name, n, maxFuncLines)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(lines) < 20 {
		t.Fatalf("found %d packages: the walk missed the tree", len(lines))
	}
	for dir, n := range lines {
		if n > maxPackageLines {
			t.Errorf("%s has %d lines of non-test Go, more than %d: give a concept of it a package of its own", strings.TrimPrefix(dir, "../../"), n, maxPackageLines)
		}
	}
}
