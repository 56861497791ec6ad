package console_test

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stubbornhq/stubborn/console"
)

func get(t *testing.T, method, target string, header http.Header) (*http.Response, []byte) {
	t.Helper()
	req := httptest.NewRequest(method, target, nil)
	for k, v := range header {
		req.Header[k] = v
	}
	rec := httptest.NewRecorder()
	console.Handler().ServeHTTP(rec, req)
	res := rec.Result()
	body, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return res, body
}

// The page at "/", naming its assets with their hashes.
func TestIndex(t *testing.T) {
	res, body := get(t, http.MethodGet, "/", nil)
	require.Equal(t, http.StatusOK, res.StatusCode)
	assert.Equal(t, "text/html; charset=utf-8", res.Header.Get("Content-Type"))
	assert.Equal(t, "no-cache", res.Header.Get("Cache-Control"))
	assert.NotEmpty(t, res.Header.Get("ETag"))
	assert.Contains(t, res.Header.Get("Content-Security-Policy"), "connect-src 'self'")
	assert.Contains(t, res.Header.Get("Content-Security-Policy"), "frame-ancestors 'none'")
	assert.Equal(t, "nosniff", res.Header.Get("X-Content-Type-Options"))
	assert.Contains(t, string(body), `<main id="main"`)
	assert.Regexp(t, `src="app\.js\?v=[0-9a-f]{16}"`, string(body))
	assert.Regexp(t, `href="app\.css\?v=[0-9a-f]{16}"`, string(body))

	res2, body2 := get(t, http.MethodGet, "/index.html", nil)
	assert.Equal(t, http.StatusOK, res2.StatusCode)
	assert.Equal(t, body, body2)

	// Revalidation answers 304 without a body.
	res, body = get(t, http.MethodGet, "/", http.Header{"If-None-Match": {res.Header.Get("ETag")}})
	assert.Equal(t, http.StatusNotModified, res.StatusCode)
	assert.Empty(t, body)

	res, body = get(t, http.MethodHead, "/", nil)
	assert.Equal(t, http.StatusOK, res.StatusCode)
	assert.Empty(t, body)
}

// The assets: their content types, cached for good under the hash that
// index.html names, revalidated otherwise, gzipped on request.
func TestAssets(t *testing.T) {
	_, index := get(t, http.MethodGet, "/", nil)
	for _, tt := range []struct{ name, ctype string }{
		{"app.js", "text/javascript; charset=utf-8"},
		{"app.css", "text/css; charset=utf-8"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m := regexp.MustCompile(regexp.QuoteMeta(tt.name) + `\?v=([0-9a-f]+)`).FindStringSubmatch(string(index))
			require.NotNil(t, m, "index.html names %s", tt.name)

			res, body := get(t, http.MethodGet, "/"+m[0], nil)
			require.Equal(t, http.StatusOK, res.StatusCode)
			assert.Equal(t, tt.ctype, res.Header.Get("Content-Type"))
			assert.Equal(t, "public, max-age=31536000, immutable", res.Header.Get("Cache-Control"))
			assert.Empty(t, res.Header.Get("Content-Encoding"))
			assert.NotEmpty(t, body)

			res, _ = get(t, http.MethodGet, "/"+tt.name, nil)
			assert.Equal(t, "no-cache", res.Header.Get("Cache-Control"), "without the hash")
			res, _ = get(t, http.MethodGet, "/"+tt.name+"?v=0000000000000000", nil)
			assert.Equal(t, "no-cache", res.Header.Get("Cache-Control"), "with another build's hash")

			res, gz := get(t, http.MethodGet, "/"+m[0], http.Header{"Accept-Encoding": {"br, gzip;q=0.8"}})
			require.Equal(t, "gzip", res.Header.Get("Content-Encoding"))
			assert.Equal(t, "Accept-Encoding", res.Header.Get("Vary"))
			zr, err := gzip.NewReader(bytes.NewReader(gz))
			require.NoError(t, err)
			plain, err := io.ReadAll(zr)
			require.NoError(t, err)
			assert.Equal(t, body, plain)

			res, _ = get(t, http.MethodGet, "/"+m[0], http.Header{"Accept-Encoding": {"gzip;q=0"}})
			assert.Empty(t, res.Header.Get("Content-Encoding"))
		})
	}
}

// Nothing else is served: no directory, no source, no other method.
func TestUnknown(t *testing.T) {
	for _, p := range []string{"/nope", "/dist/", "/dist/app.js", "/web/src/main.ts", "/runs/run_1", "/app.js/", "/.."} {
		res, _ := get(t, http.MethodGet, p, nil)
		assert.Equal(t, http.StatusNotFound, res.StatusCode, p)
	}
	res, _ := get(t, http.MethodPost, "/", nil)
	assert.Equal(t, http.StatusMethodNotAllowed, res.StatusCode)
	assert.Equal(t, "GET, HEAD", res.Header.Get("Allow"))
}
