package delegatekit

import (
	"log/slog"
	"time"

	"google.golang.org/grpc"
)

// DefaultGrace is how long a server that is shutting down waits for the
// calls in flight, unless [WithGrace] says otherwise.
const DefaultGrace = 10 * time.Second

// An Option configures the server of [NewServer], [Serve], [ListenAndServe]
// and [Main].
type Option interface {
	apply(*config)
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// config is what the options set; defaultConfig holds the defaults.
type config struct {
	serverOptions []grpc.ServerOption
	grace         time.Duration
	noReflection  bool
	logger        *slog.Logger
}

func defaultConfig() config {
	return config{grace: DefaultGrace}
}

func newConfig(opts []Option) config {
	c := defaultConfig()
	for _, o := range opts {
		o.apply(&c)
	}
	if c.logger == nil {
		c.logger = slog.Default()
	}
	return c
}

// WithServerOptions adds options to the gRPC server: TLS credentials
// (grpc.Creds), interceptors, stats handlers, message size limits… By default
// there are none: the server speaks plaintext. Several WithServerOptions add
// up.
func WithServerOptions(opts ...grpc.ServerOption) Option {
	return optionFunc(func(c *config) { c.serverOptions = append(c.serverOptions, opts...) })
}

// WithGrace sets how long a shutdown lets the calls in flight finish before
// it closes every connection (their contexts are then cancelled). The
// default is [DefaultGrace]; zero or less closes at once.
func WithGrace(d time.Duration) Option {
	return optionFunc(func(c *config) { c.grace = d })
}

// WithoutReflection leaves out the gRPC server reflection service, which is
// registered by default so that tools such as grpcurl can list and call the
// DelegateService without its .proto.
func WithoutReflection() Option {
	return optionFunc(func(c *config) { c.noReflection = true })
}

// WithLogger sets where a panic in the delegate (with its stack) and
// [Main]'s start and stop lines are logged. The default, and a nil logger,
// is slog.Default().
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(c *config) { c.logger = l })
}
