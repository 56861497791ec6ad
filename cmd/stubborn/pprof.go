package main

import (
	"net/http"
	"net/http/pprof"
)

// pprofPath is where serve -pprof-listen serves the profiles.
const pprofPath = "/debug/pprof/"

// pprofHandler serves net/http/pprof's profiles on a mux of its own, for
// -pprof-listen only. Importing net/http/pprof also registers them on
// http.DefaultServeMux, which serve never serves. /debug/pprof/cmdline is
// left out: the command line may hold secrets (a password in -nats-url).
func pprofHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+pprofPath, pprof.Index) // the index, and every named profile (heap, goroutine, …)
	mux.HandleFunc("GET "+pprofPath+"profile", pprof.Profile)
	mux.HandleFunc("GET "+pprofPath+"symbol", pprof.Symbol)
	mux.HandleFunc("POST "+pprofPath+"symbol", pprof.Symbol)
	mux.HandleFunc("GET "+pprofPath+"trace", pprof.Trace)
	return mux
}
