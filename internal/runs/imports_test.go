package runs_test

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestImportsGoOneWay keeps the rooms of the engine apart: the engine
// (runs) and its stores meet only in the contract (runs/store); the engine
// imports no store and nothing of NATS (the binary wires a store in), a
// store imports no engine, and the contract imports neither.
func TestImportsGoOneWay(t *testing.T) {
	const mod = "github.com/stubbornhq/stubborn/internal/"
	rules := []struct {
		dir       string
		forbidden []string
	}{
		{".", []string{mod + "runs/jsstore", mod + "runs/memstore", mod + "server", "github.com/nats-io/"}},
		{"store", []string{mod + "runs", mod + "server", "github.com/nats-io/"}},
		{"jsstore", []string{mod + "runs", mod + "runs/memstore", mod + "server"}},
		{"memstore", []string{mod + "runs", mod + "runs/jsstore", mod + "server", "github.com/nats-io/"}},
	}
	for _, rule := range rules {
		files, err := filepath.Glob(filepath.Join(rule.dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		if len(files) == 0 {
			t.Fatalf("no Go files in %s", rule.dir)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			parsed, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			for _, imp := range parsed.Imports {
				path, _ := strconv.Unquote(imp.Path.Value)
				for _, bad := range rule.forbidden {
					// runs/store is the contract: every room may import it.
					if path == mod+"runs/store" {
						continue
					}
					if path == bad || strings.HasPrefix(path, strings.TrimSuffix(bad, "/")+"/") {
						t.Errorf("%s imports %s: the engine and its stores meet only in runs/store", f, path)
					}
				}
			}
		}
	}
}
