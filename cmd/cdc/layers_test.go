package main

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
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

// TestOneGate (docs/security.md, "One gate"): every record the connector
// produces for an event passes relay's gate, because the producer is
// reached from one function only. It type-checks the module and lists
// every use of a producer's methods (sink.Kafka's Send and Produce,
// franz-go's Produce, ProduceSync and TryProduce): outside package sink
// itself, only the gate's produce may use them for events, and the
// checkpoint's own writers for the connector's records. A new path that
// produces without the gate fails here, naming where.
func TestOneGate(t *testing.T) {
	// Where the producer may be used, and why: the gate for events, the
	// connector's own records (the checkpoint, a request) elsewhere.
	allowed := map[string]string{
		"internal/relay.produce":      "the gate: every event's record",
		"internal/checkpoint.produce": "the checkpoint store's records",
		"internal/delivery.CommitNow": "exactly once: the checkpoint, last in its transaction",
		"internal/session.acks":       "the Confirmer's checkpoints, through the session's producer",
		"internal/session.settler":    "a checkpoint a redrive saves, through the session's producer",
		"internal/session.Save":       "the first start's progress in the checkpoint",
	}
	const module = "github.com/outboxcdc/cdc/"
	out, err := exec.Command("go", "list", "-export", "-deps", "-f", "{{.ImportPath}}\t{{.Export}}\t{{.Dir}}\t{{join .GoFiles \" \"}}\t{{.Standard}}", "../../...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	exports := map[string]string{}
	type pkg struct {
		path, dir string
		files     []string
	}
	var ours []pkg
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Split(line, "\t")
		exports[f[0]] = f[1]
		if strings.HasPrefix(f[0], module) && f[3] != "" {
			ours = append(ours, pkg{f[0], f[2], strings.Fields(f[3])})
		}
	}
	fset := token.NewFileSet()
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		if e := exports[path]; e != "" {
			return os.Open(e)
		}
		return nil, fmt.Errorf("no export data for %s", path)
	})
	producers := map[string]map[string]bool{
		module + "internal/sink.Kafka":            {"Send": true, "Produce": true},
		"github.com/twmb/franz-go/pkg/kgo.Client": {"Produce": true, "ProduceSync": true, "TryProduce": true},
		module + "internal/delivery.Transactions": {"Produce": true},
	}
	found := 0
	for _, p := range ours {
		var files []*ast.File
		for _, name := range p.files {
			f, err := parser.ParseFile(fset, filepath.Join(p.dir, name), nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			files = append(files, f)
		}
		info := &types.Info{Selections: map[*ast.SelectorExpr]*types.Selection{}}
		if _, err := (&types.Config{Importer: imp}).Check(p.path, fset, files, info); err != nil {
			t.Fatalf("type-check %s: %v", p.path, err)
		}
		rel := strings.TrimPrefix(p.path, module)
		for _, f := range files {
			for _, decl := range f.Decls {
				fn, ok := decl.(*ast.FuncDecl)
				if !ok {
					continue
				}
				ast.Inspect(fn, func(n ast.Node) bool {
					sel, ok := n.(*ast.SelectorExpr)
					if !ok {
						return true
					}
					s := info.Selections[sel]
					if s == nil || s.Kind() == types.FieldVal {
						return true
					}
					recv := s.Recv()
					if ptr, ok := recv.(*types.Pointer); ok {
						recv = ptr.Elem()
					}
					named, ok := recv.(*types.Named)
					if !ok || named.Obj().Pkg() == nil || !producers[named.Obj().Pkg().Path()+"."+named.Obj().Name()][sel.Sel.Name] {
						return true
					}
					found++
					if rel == "internal/sink" {
						return true
					}
					if _, ok := allowed[rel+"."+fn.Name.Name]; !ok {
						t.Errorf("%s: %s uses the producer (%s.%s) without the gate: send an event's record through relay.Sender.produce (docs/security.md, \"One gate\")",
							fset.Position(sel.Pos()), fn.Name.Name, named.Obj().Name(), sel.Sel.Name)
					}
					return true
				})
			}
		}
	}
	if found < 5 {
		t.Fatalf("found %d uses of the producer: the check no longer sees them", found)
	}
}
