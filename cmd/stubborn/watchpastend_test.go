package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/delegates/demo"
)

// WatchRun on a finished run with after_seq at or past its last event
// ends at once, OK, with no event, on both stores, through the gRPC API
// and `stubborn watch RUN -after N`, which exits 0 for a succeeded run
// (issue 30 item 7: the default store never ended, and the CLI on
// -memory exited 1 without a word). On the default store the server is
// restarted too, so that the run is read from the store rather than from
// the copy of the server that ran it.
func TestWatchPastTheEndEndsAtOnce(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	echo := demo.Serve(lis, demo.Echo{})
	t.Cleanup(echo.Stop)
	for name, store := range map[string][]string{"memory": {"-memory"}, "embedded": {"-durability", "always"}} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			config := filepath.Join(dir, "stubborn.yaml")
			require.NoError(t, os.WriteFile(config, fmt.Appendf(nil, "delegates:\n  - {name: echo, target: %q}\n", lis.Addr()), 0o600))
			args := append([]string{"-config", config, "-listen", "127.0.0.1:0", "-data-dir", filepath.Join(dir, "data")}, store...)
			srv := startServer(t, args...)
			errs := captureStderr(t)

			cli := func(args ...string) (string, int, error) {
				var out bytes.Buffer
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				code, err := run(ctx, args, &out)
				return out.String(), code, err
			}
			t.Setenv("STUBBORN_ADDR", srv.addr)
			out, code, err := cli("run", "-brief", "hi", "-delegates", "echo", "-json")
			require.NoError(t, err)
			require.Equal(t, 0, code, out)
			var id string
			var last int64
			for _, line := range bytes.Split(bytes.TrimSpace([]byte(out)), []byte("\n")) {
				var ev struct {
					RunID string `json:"runId"`
					Seq   string `json:"seq"`
				}
				require.NoError(t, json.Unmarshal(line, &ev), "%s", line)
				id = ev.RunID
				last, err = strconv.ParseInt(ev.Seq, 10, 64)
				require.NoError(t, err)
			}
			require.NotEmpty(t, id)
			require.Greater(t, last, int64(1))

			check := func(t *testing.T, addr string) {
				conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
				require.NoError(t, err)
				defer conn.Close()
				client := stubbornv1.NewControlServiceClient(conn)
				for _, after := range []int64{last - 1, last, last + 13} {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					began := time.Now()
					stream, err := client.WatchRun(ctx, &stubbornv1.WatchRunRequest{RunId: id, AfterSeq: after})
					require.NoError(t, err)
					n := 0
					for {
						_, err = stream.Recv()
						if err != nil {
							break
						}
						n++
					}
					cancel()
					assert.True(t, errors.Is(err, io.EOF), "after_seq %d of %d: ends OK, got %v", after, last, err)
					assert.Equal(t, int(max(0, last-after)), n, "after_seq %d of %d", after, last)
					assert.Less(t, time.Since(began), 5*time.Second, "after_seq %d: at once", after)

					t.Setenv("STUBBORN_ADDR", addr)
					out, code, err := cli("watch", id, "-after", strconv.FormatInt(after, 10))
					assert.NoError(t, err, "watch -after %d", after)
					assert.Equal(t, 0, code, "watch -after %d of a succeeded run: %s", after, out)
					if after >= last {
						assert.Empty(t, out, "watch -after %d: no events", after)
						assert.Contains(t, errs.String(), fmt.Sprintf("run %s: SUCCEEDED, no events after seq %d\n", id, after))
					}
				}
			}
			check(t, srv.addr)
			if name == "memory" {
				return
			}
			// Restarted: the run is the store's.
			require.NoError(t, srv.cmd.Process.Signal(syscall.SIGTERM))
			_ = srv.cmd.Wait()
			srv = startServer(t, args...)
			check(t, srv.addr)
		})
	}
}
