package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
	"unicode"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// defaultWait is how long a client command waits for a server that is
// not answering yet (-wait): one started a moment before, as `serve &`
// followed by a client command is.
const defaultWait = 10 * time.Second

// reattachWait is how long run and watch wait for a server that went away
// under them to come back (a restart), at least -wait.
const reattachWait = time.Minute

// stderr is where client commands write what is not their output: that
// they wait for a server, hints. Tests replace it.
var stderr io.Writer = os.Stderr

// clientFlags are the flags every client command has.
type clientFlags struct {
	addr string
	wait time.Duration
}

// register registers -addr (STUBBORN_ADDR, else defaultAddr, unless
// given) and -wait.
func (c *clientFlags) register(fs *flag.FlagSet) {
	def := defaultAddr
	if env := os.Getenv("STUBBORN_ADDR"); env != "" {
		def = env
	}
	fs.StringVar(&c.addr, "addr", def, "Stubborn server address (STUBBORN_ADDR sets the default)")
	fs.DurationVar(&c.wait, "wait", defaultWait, "how long to wait for a server that does not answer yet (one starting); 0 fails at once")
}

// client is a connection to a Stubborn server, for the CLI's commands.
type client struct {
	stubbornv1.ControlServiceClient
	conn *grpc.ClientConn
	addr string
}

// connect dials the server at f.addr with the credentials the environment
// gives (clientOptions) and waits up to f.wait for it to answer: a server
// started a moment before may not listen yet. It says on stderr that it
// waits; a server that never answers is left to the first call to report,
// which explain words.
func connect(ctx context.Context, f clientFlags) (*client, error) {
	c, err := dial(f.addr)
	if err != nil {
		return nil, err
	}
	if !c.waitReady(ctx, f.wait, "") && ctx.Err() != nil {
		c.close()
		return nil, errInterrupted
	}
	return c, nil
}

// errInterrupted ends a client command interrupted (Ctrl-C) while it
// waited for a server: exit 130, with nothing more to say.
var errInterrupted = errors.New("interrupted")

// dial connects to a Stubborn server, with the credentials the environment
// gives (clientOptions); its calls' errors are worded by explain.
func dial(addr string) (*client, error) {
	opts, err := clientOptions(addr, os.Getenv)
	if err != nil {
		return nil, err
	}
	c := &client{addr: addr}
	opts = append(opts,
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			return c.explain(invoker(ctx, method, req, reply, cc, opts...))
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			s, err := streamer(ctx, desc, cc, method, opts...)
			if err != nil {
				return nil, c.explain(err)
			}
			return explainedStream{s, c}, nil
		}),
	)
	if c.conn, err = grpc.NewClient(addr, opts...); err != nil {
		return nil, err
	}
	c.ControlServiceClient = stubbornv1.NewControlServiceClient(c.conn)
	return c, nil
}

func (c *client) close() { _ = c.conn.Close() }

// waitReady waits up to wait for the connection to be ready, and once a
// first attempt failed says on stderr that it waits: what says why ("" for
// a first connection, which names -wait). It reports whether the
// connection is ready.
func (c *client) waitReady(ctx context.Context, wait time.Duration, what string) bool {
	c.conn.Connect()
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	said := false
	for {
		s := c.conn.GetState()
		switch s {
		case connectivity.Ready:
			return true
		case connectivity.TransientFailure:
			if !said && wait > 0 {
				said = true
				if what == "" {
					what = fmt.Sprintf("no server answers on %s yet: waiting up to %s for one (-wait)", c.addr, wait.Round(time.Second))
				}
				fmt.Fprintf(stderr, "stubborn: %s\n", what)
			}
		case connectivity.Shutdown:
			return false
		}
		if !c.conn.WaitForStateChange(ctx, s) {
			return false
		}
	}
}

// explainedStream words its stream's errors as explain does.
type explainedStream struct {
	grpc.ClientStream
	c *client
}

func (s explainedStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if errors.Is(err, io.EOF) {
		return err
	}
	return s.c.explain(err)
}

// cliError is a call's error as the CLI prints it: the server's message
// without grpc-go's `rpc error: code = … desc =` wrapper, and what to do
// next. It keeps the status, for the code to be read (status.FromError,
// status.Code).
type cliError struct {
	st  *status.Status
	msg string
}

func (e *cliError) Error() string              { return e.msg }
func (e *cliError) GRPCStatus() *status.Status { return e.st }

// explain words a call's error for a person: the message with the code in
// words where the message does not say it, and the next step where there
// is one. An error that is not a gRPC status (or is already worded) is
// returned as it is.
func (c *client) explain(err error) error {
	if err == nil {
		return nil
	}
	var done *cliError
	if errors.As(err, &done) {
		return err
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	msg := st.Message()
	switch st.Code() {
	case codes.Unavailable:
		if c.conn.GetState() != connectivity.Ready {
			msg = fmt.Sprintf("no Stubborn server answers on %s (%s): is `stubborn serve` running on %s? (-addr, STUBBORN_ADDR)", c.addr, dialCause(msg), c.addr)
		} else if !strings.Contains(msg, "try again") {
			msg += " (unavailable: try again)"
		}
	case codes.Unauthenticated:
		if os.Getenv("STUBBORN_TOKEN") == "" {
			msg += ": send a token: STUBBORN_TOKEN (a tenant's; `stubborn token` makes one)"
		} else {
			msg += " (the one in STUBBORN_TOKEN)"
		}
	case codes.Canceled:
		msg = "cancelled"
	case codes.DeadlineExceeded:
		msg = "no answer in time: " + msg
	case codes.InvalidArgument, codes.NotFound, codes.AlreadyExists, codes.FailedPrecondition, codes.OK:
		// The server's messages name the field and what is wrong.
	default:
		if w := codeWords(st.Code()); !strings.Contains(strings.ToLower(msg), w) {
			msg += " (" + w + ")"
		}
	}
	return &cliError{st: st, msg: msg}
}

// dialCause is the cause in a connection error's message, without
// grpc-go's layers: `connection error: desc = "transport: Error while
// dialing: dial tcp 127.0.0.1:7300: connect: connection refused"` is
// "connection refused".
func dialCause(msg string) string {
	msg = strings.TrimSuffix(msg, `"`)
	for _, layer := range []string{`connection error: desc = "`, "transport: ", "Error while dialing: ", "dial tcp ", "connect: "} {
		if _, rest, ok := strings.Cut(msg, layer); ok {
			msg = rest
		}
	}
	return msg
}

// codeWords is a gRPC code in lower-case words: NotFound is "not found".
func codeWords(c codes.Code) string {
	var b strings.Builder
	for i, r := range c.String() {
		if unicode.IsUpper(r) && i > 0 {
			b.WriteByte(' ')
		}
		b.WriteRune(unicode.ToLower(r))
	}
	return b.String()
}
