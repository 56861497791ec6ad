package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stubbornhq/stubborn/internal/delegates"
)

// Notify targets need -public-url, which needs -http-listen to serve
// the links.
func TestPublicURLFlag(t *testing.T) {
	targets := &delegates.Config{Notify: []delegates.NotifyTarget{{URL: "https://h.example/x", SecretEnv: "S"}}}
	none := &delegates.Config{}
	for _, tt := range []struct {
		name            string
		cfg             *delegates.Config
		publicURL, http string
		want            string
	}{
		{"targets without -public-url", targets, "", "127.0.0.1:7301", "give -public-url"},
		{"no -http-listen", targets, "https://stubborn.example.com", "", "-public-url needs -http-listen"},
		{"not http", none, "ftp://stubborn.example.com", "127.0.0.1:7301", "-public-url must be an http or https URL"},
		{"a query", none, "https://stubborn.example.com/?a=b", "127.0.0.1:7301", "-public-url must be an http or https URL"},
		{"fine", targets, "https://stubborn.example.com", "127.0.0.1:7301", ""},
		{"nothing asked", none, "", "", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := checkPublicURL(tt.cfg, tt.publicURL, tt.http)
			if tt.want == "" {
				require.NoError(t, err)
				return
			}
			assert.ErrorContains(t, err, tt.want)
		})
	}
}
