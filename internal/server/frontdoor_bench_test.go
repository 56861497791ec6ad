package server_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// BenchmarkFrontDoor is a Chat Completions request through the front door
// (memory store, model = a delegate behind a fake model server) beside the
// same request to the fake model directly: compare the two ns/op of one
// run. go test -run '^$' -bench FrontDoor -cpuprofile cpu.out ./server
func BenchmarkFrontDoor(b *testing.B) {
	_, base := frontDoorEnv(b, setup{})
	direct := chatModel(b, http.StatusOK, "The ", "answer ", "is ", "42.")
	const body = `{"model":"good","messages":[{"role":"user","content":"What is the answer?"}]}`
	for _, c := range []struct{ name, url string }{
		{"direct", direct + "/chat/completions"},
		{"frontdoor", base + "/v1/chat/completions"},
	} {
		for _, stream := range []bool{false, true} {
			req := body
			name := c.name + "/plain"
			if stream {
				req = strings.Replace(body, `{"model"`, `{"stream":true,"model"`, 1)
				name = c.name + "/stream"
			}
			b.Run(name, func(b *testing.B) {
				for b.Loop() {
					resp, err := http.Post(c.url, "application/json", strings.NewReader(req))
					require.NoError(b, err)
					_, err = io.Copy(io.Discard, resp.Body)
					require.NoError(b, err)
					require.NoError(b, resp.Body.Close())
					require.Equal(b, http.StatusOK, resp.StatusCode)
				}
			})
		}
	}
}
