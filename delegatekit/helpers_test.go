package delegatekit_test

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	"github.com/stubbornhq/stubborn/delegatekit"
	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func req(brief string) *stubbornv1.ExecuteRequest {
	return &stubbornv1.ExecuteRequest{Brief: brief, Attempt: 1}
}

// served is a delegate served over bufconn by delegatekit.Serve, and a
// client connection to it.
type served struct {
	conn     *grpc.ClientConn
	delegate stubbornv1.DelegateServiceClient
	// shutdown ends Serve's context and returns what Serve returned.
	shutdown func() error
}

// serve serves fn with opts until the test ends (or shutdown).
func serve(t *testing.T, fn delegatekit.Func, opts ...delegatekit.Option) *served {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- delegatekit.Serve(ctx, lis, fn, opts...) }()
	var (
		once sync.Once
		err  error
	)
	shutdown := func() error {
		once.Do(func() {
			cancel()
			err = <-errc
		})
		return err
	}
	conn := dialBuf(t, lis)
	t.Cleanup(func() {
		_ = conn.Close()
		_ = shutdown()
	})
	return &served{conn: conn, delegate: stubbornv1.NewDelegateServiceClient(conn), shutdown: shutdown}
}

// dialBuf returns a client connection to lis, closed when the test ends.
func dialBuf(t *testing.T, lis *bufconn.Listener) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///bufconn",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// syncBuffer is a log destination safe to read while a server writes it.
type syncBuffer struct {
	mu  sync.Mutex
	buf []byte
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	return len(p), nil
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}
