package controls_test

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestControlsImportNoServerStorageOrClock keeps the controls pure: they
// reach the world only through Env (DESIGN.md, "Imports go one way").
func TestControlsImportNoServerStorageOrClock(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	allowed := map[string]bool{
		"google.golang.org/grpc/codes":                   true, // status codes are data, not transport
		"google.golang.org/genproto/googleapis/rpc/code": true, // their canonical names
		"github.com/stubbornhq/stubborn/gen/stubborn/v1": true,
	}
	forbidden := []string{
		"google.golang.org/grpc", "github.com/nats-io/", "github.com/stubbornhq/stubborn/",
		"net", "os", "database/",
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
			if allowed[path] {
				continue
			}
			for _, bad := range forbidden {
				if path == bad || strings.HasPrefix(path, bad+"/") || strings.HasSuffix(bad, "/") && strings.HasPrefix(path, bad) {
					t.Errorf("%s imports %s: controls must stay free of servers, storage and I/O", f, path)
				}
			}
		}
	}
}
