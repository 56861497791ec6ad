package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// A reload never loosens the security by accident (issue 30 item 3): an
// emptied file, files cut short at several places and a file without its
// tenants are refused, logged at ERROR, and the config in use (its
// tenants, so its authentication) is kept; `tenants: []` said explicitly
// removes them. On the embedded store, as shipped.
func TestReloadRefusesEmptyTruncatedAndTenantlessFiles(t *testing.T) {
	dir := t.TempDir()
	config := filepath.Join(dir, "stubborn.yaml")
	const token = "reload-failsafe-token"
	sum := sha256.Sum256([]byte(token))
	delegatesPart := "delegates:\n  - {name: echo, target: \"127.0.0.1:1\"}\n  - {name: other, target: \"127.0.0.1:2\"}\n"
	tenantsPart := "tenants:\n  - name: team-a\n    token_sha256: [" + hex.EncodeToString(sum[:]) + "]\n"
	full := delegatesPart + tenantsPart
	require.NoError(t, os.WriteFile(config, []byte(full), 0o600))
	srv := startServer(t, "-config", config, "-listen", "127.0.0.1:0", "-data-dir", filepath.Join(dir, "data"))

	conn, err := grpc.NewClient(srv.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	client := stubbornv1.NewControlServiceClient(conn)
	list := func(withToken bool) (int, codes.Code) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if withToken {
			ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
		}
		resp, err := client.ListDelegates(ctx, &stubbornv1.ListDelegatesRequest{})
		return len(resp.GetDelegates()), status.Code(err)
	}
	_, code := list(false)
	require.Equal(t, codes.Unauthenticated, code, "tenants: a call must authenticate")

	// lines counts the log lines holding every one of parts.
	lines := func(parts ...string) int {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		n := 0
	next:
		for _, line := range strings.Split(srv.logs.String(), "\n") {
			for _, p := range parts {
				if !strings.Contains(line, p) {
					continue next
				}
			}
			n++
		}
		return n
	}
	lastLine := func(part string) string {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		var last string
		for _, line := range strings.Split(srv.logs.String(), "\n") {
			if strings.Contains(line, part) {
				last = line
			}
		}
		return last
	}
	refused := `"msg":"config not reloaded: keeping the one in use"`
	for _, tt := range []struct {
		name, src, want string
	}{
		{"emptied (: > stubborn.yaml)", "", "the file is empty"},
		{"comments only", "# truncated\n", "the file is empty"},
		{"cut after delegates:", "delegates:\n", "delegates: no value"},
		{"cut before tenants:", delegatesPart, "the file has no `tenants:` while 1 are in use"},
		{"cut after tenants:", delegatesPart + "tenants:\n", "tenants: no value"},
		{"cut inside a token", full[:len(full)-20], "did not find expected ',' or ']'"},
		{"cut inside the delegates", delegatesPart[:40], "found unexpected end of stream"},
		{"tenants only", tenantsPart, "the file has no `delegates:` while 2 are in use"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			before := lines(refused)
			require.NoError(t, os.WriteFile(config, []byte(tt.src), 0o600))
			require.Eventually(t, func() bool { return lines(refused) > before }, 10*time.Second, 10*time.Millisecond)
			last := lastLine(refused)
			assert.Contains(t, last, `"level":"ERROR"`)
			assert.Contains(t, last, tt.want)
			_, code := list(false)
			assert.Equal(t, codes.Unauthenticated, code, "authentication stays on")
			n, code := list(true)
			assert.Equal(t, codes.OK, code)
			assert.Equal(t, 2, n, "the registry is kept")
		})
	}
	assert.Zero(t, lines(`"msg":"config reloaded"`), "nothing was applied")

	// Said explicitly, the tenants go, with a warning.
	require.NoError(t, os.WriteFile(config, []byte(delegatesPart+"tenants: []\n"), 0o600))
	require.Eventually(t, func() bool { return lines(`"msg":"config reloaded"`) == 1 }, 10*time.Second, 10*time.Millisecond)
	assert.Equal(t, 1, lines(`"level":"WARN"`, "authentication is off"))
	n, code := list(false)
	assert.Equal(t, codes.OK, code)
	assert.Equal(t, 2, n)
}

// The same rule at start: an empty file, or one cut after its tenants:,
// is an error naming the file; the server does not serve.
func TestServeRefusesAnEmptyConfigFile(t *testing.T) {
	dir := t.TempDir()
	for name, src := range map[string]string{"empty": "", "cut after tenants:": "delegates: []\ntenants:\n"} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(name, " ", "-")+".yaml")
			require.NoError(t, os.WriteFile(path, []byte(src), 0o600))
			// Bounded: a server that accepted the file would serve on.
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			code, err := run(ctx, []string{"serve", "-memory", "-config", path, "-listen", "127.0.0.1:0"}, &bytes.Buffer{})
			assert.NotZero(t, code)
			require.Error(t, err)
			assert.Contains(t, err.Error(), path+": invalid delegates config: ")
		})
	}
}
