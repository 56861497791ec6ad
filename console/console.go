// Package console serves Stubborn's web console: a page that lists runs,
// follows one live on a timeline, decides and cancels runs, and starts
// them, through the ControlService's Connect API on the same origin
// (server.Stubborn.HTTPHandler mounts it at "/").
//
// The console is built from console/web (TypeScript, bundled by esbuild:
// `make console`) into console/dist, which is committed and embedded here,
// so the binary needs nothing else. `make checkconsole` fails when dist is
// not what the sources build.
package console

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"strings"
	"sync"
	"time"
)

//go:embed dist
var dist embed.FS

// The security headers of every answer: the page loads only its own
// script and style, and talks only to its own origin (the API); it is
// never framed.
const csp = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; " +
	"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// asset is one file of dist, ready to serve.
type asset struct {
	name  string
	body  []byte
	gz    []byte // body gzipped, when that is smaller
	ctype string
	etag  string // of body; the gzipped body's ends in -gz"
	hash  string // first 16 hex digits of the SHA-256, as index.html names it (?v=)
}

// types are the content types of what the build writes, fixed here rather
// than taken from the system's MIME table, which may differ by machine.
var types = map[string]string{
	".html": "text/html; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
	".css":  "text/css; charset=utf-8",
}

var (
	loadOnce sync.Once
	assets   map[string]*asset
)

func load() {
	assets = make(map[string]*asset)
	err := fs.WalkDir(dist, "dist", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		body, err := dist.ReadFile(p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(body)
		hexSum := hex.EncodeToString(sum[:])
		name := strings.TrimPrefix(p, "dist/")
		ctype, ok := types[path.Ext(name)]
		if !ok {
			ctype = mime.TypeByExtension(path.Ext(name))
		}
		if ctype == "" {
			ctype = "application/octet-stream"
		}
		a := &asset{name: name, body: body, ctype: ctype, etag: `"` + hexSum[:32] + `"`, hash: hexSum[:16]}
		var buf bytes.Buffer
		zw, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
		_, _ = zw.Write(body)
		if zw.Close() == nil && buf.Len() < len(body) {
			a.gz = buf.Bytes()
		}
		assets[name] = a
		return nil
	})
	if err != nil {
		// The embedded files are part of the binary: reading them cannot
		// fail unless the build is broken.
		panic("console: reading the embedded dist: " + err.Error())
	}
}

// Handler serves the console: index.html at "/" (and "/index.html"), and
// the files it loads (app.js, app.css). Anything else is 404, and there is
// no directory listing: the pages are hash routes (#/runs/<id>), so the
// server only ever sees "/". Only GET and HEAD are answered (405 otherwise).
//
// index.html is revalidated on every load (Cache-Control: no-cache, with an
// ETag); an asset requested as index.html names it, with its content hash
// (app.js?v=<hash>), is cached for a year as immutable, since another
// build names another hash; without the hash, or with a stale one, it is
// revalidated like the page. Bodies are gzipped when the client accepts it.
func Handler() http.Handler {
	loadOnce.Do(load)
	return http.HandlerFunc(serve)
}

func serve(w http.ResponseWriter, r *http.Request) {
	name := strings.TrimPrefix(r.URL.Path, "/")
	if name == "" {
		name = "index.html"
	}
	a, ok := assets[name]
	h := w.Header()
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	if !ok {
		http.NotFound(w, r)
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		h.Set("Allow", "GET, HEAD")
		http.Error(w, http.StatusText(http.StatusMethodNotAllowed), http.StatusMethodNotAllowed)
		return
	}
	if name == "index.html" {
		h.Set("Content-Security-Policy", csp)
		h.Set("X-Frame-Options", "DENY")
	}
	if name != "index.html" && r.URL.Query().Get("v") == a.hash {
		h.Set("Cache-Control", "public, max-age=31536000, immutable")
	} else {
		h.Set("Cache-Control", "no-cache")
	}
	h.Set("Content-Type", a.ctype)
	h.Set("ETag", a.etag)
	body := a.body
	if a.gz != nil {
		h.Add("Vary", "Accept-Encoding")
		if acceptsGzip(r) {
			h.Set("Content-Encoding", "gzip")
			h.Set("ETag", strings.TrimSuffix(a.etag, `"`)+`-gz"`)
			body = a.gz
		}
	}
	// ServeContent answers If-None-Match (304) and Range; the modification
	// time is unknown (embedded), so no Last-Modified is sent.
	http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(body))
}

// acceptsGzip reports whether r's Accept-Encoding allows gzip (q > 0).
func acceptsGzip(r *http.Request) bool {
	for _, v := range r.Header.Values("Accept-Encoding") {
		for _, part := range strings.Split(v, ",") {
			coding, params, _ := strings.Cut(strings.TrimSpace(part), ";")
			if !strings.EqualFold(strings.TrimSpace(coding), "gzip") && strings.TrimSpace(coding) != "*" {
				continue
			}
			q := strings.ReplaceAll(strings.TrimSpace(params), " ", "")
			if q == "q=0" || q == "q=0.0" || q == "q=0.00" || q == "q=0.000" {
				continue
			}
			return true
		}
	}
	return false
}
