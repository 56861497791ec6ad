package server

import (
	"log/slog"

	"google.golang.org/grpc"
)

// PendingMalformed counts the requests s's codec could not decode that no
// interceptor has answered yet.
func PendingMalformed(s *Stubborn) int { return s.svc.malformed.pending() }

// CheckPlaintextListenWith is CheckPlaintextListen resolving names with
// lookup.
var CheckPlaintextListenWith = checkPlaintextListen

// RegistriesClosed counts the registries s let go of: replaced by a
// reload, their last run ended.
func RegistriesClosed(s *Stubborn) int {
	s.svc.regs.mu.Lock()
	defer s.svc.regs.mu.Unlock()
	return s.svc.regs.closed
}

// NewServerWithoutRuns returns the gRPC server New would build around a
// ControlService with no runs layer, whose handlers panic on any call that
// reaches one.
func NewServerWithoutRuns(logger *slog.Logger) *grpc.Server {
	o := options{Known: func(string) bool { return true }, Logger: logger}
	o.regs = &registries{}
	_ = o.regs.swap(newRegistry(o, nil)) // a new one: not retired
	g, _ := newGRPCServer(newService(nil, o), o)
	return g
}

// The names below are unexported; the package's external tests use them.
const (
	HTTP2PingAfter   = http2PingAfter
	HTTP2PingTimeout = http2PingTimeout
	HTTPBodyTimeout  = httpBodyTimeout
	MaxHTTPBodyBytes = maxHTTPBodyBytes
)
