package delegates

import (
	"context"
	"maps"
	"strconv"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/stubbornhq/stubborn/controls"
	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// transport is how the Pool reaches one delegate, by kind.
type transport interface {
	// call sends one attempt. ctx carries the attempt's deadline. An error
	// is a *controls.CallError, or one that Classify turns into one.
	call(ctx context.Context, c controls.Call) (*stubbornv1.Result, error)
	// serving answers a health check: false only for a clear "not
	// serving".
	// serving asks the delegate whether it serves (health.go).
	serving(ctx context.Context) health
	close() error
}

// newTransport builds d's transport by its kind.
func (p *Pool) newTransport(d Delegate, opts []grpc.DialOption) (transport, error) {
	tc, err := d.TLS.ClientConfig()
	if err != nil {
		return nil, err
	}
	switch {
	case d.HTTP != nil:
		return &httpTransport{httpClient: p.newHTTPClient(tc, d.HTTP.HealthURL), cfg: d.HTTP}, nil
	case d.OpenAI != nil:
		return newOpenAITransport(d.OpenAI, p.newHTTPClient(tc, d.OpenAI.HealthURL)), nil
	case d.Anthropic != nil:
		return newAnthropicTransport(d.Anthropic, p.newHTTPClient(tc, d.Anthropic.HealthURL)), nil
	}
	creds := insecure.NewCredentials()
	if tc != nil {
		creds = credentials.NewTLS(tc)
	}
	all := append([]grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithDisableRetry(),
		// Past max_result_bytes an answer fails its attempt (Call);
		// one so large that gRPC will not read it fails the same.
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(p.maxResult + recvSlack)),
	}, opts...)
	conn, err := grpc.NewClient(d.Target, all...)
	if err != nil {
		return nil, err
	}
	return &grpcTransport{
		conn:   conn,
		client: stubbornv1.NewDelegateServiceClient(conn),
		health: healthpb.NewHealthClient(conn),
		p:      p,
	}, nil
}

// grpcTransport reaches a delegate that serves stubborn.v1.DelegateService
// over one shared, lazily connecting client connection.
type grpcTransport struct {
	conn   *grpc.ClientConn
	client stubbornv1.DelegateServiceClient
	health healthpb.HealthClient
	p      *Pool
}

func (g *grpcTransport) call(ctx context.Context, c controls.Call) (*stubbornv1.Result, error) {
	kv := make([]string, 0, 6)
	if c.Attempt > 0 {
		kv = append(kv, HeaderAttempt, strconv.Itoa(int(c.Attempt)))
	}
	if c.IdempotencyKey != "" {
		kv = append(kv, HeaderIdempotencyKey, c.IdempotencyKey)
	}
	if c.RunID != "" {
		kv = append(kv, HeaderRunID, c.RunID)
	}
	if len(kv) > 0 {
		ctx = metadata.AppendToOutgoingContext(ctx, kv...)
	}
	req := &stubbornv1.ExecuteRequest{
		Brief:          c.Brief,
		RunId:          c.RunID,
		Attempt:        c.Attempt,
		IdempotencyKey: c.IdempotencyKey,
		Metadata:       maps.Clone(c.Metadata),
	}
	var (
		trailer metadata.MD
		pr      peer.Peer
	)
	resp, err := g.client.Execute(ctx, req, grpc.Trailer(&trailer), grpc.Peer(&pr))
	if err != nil {
		ce := Classify(err, trailer)
		if tooLarge(ce) {
			ce = g.p.resultTooLarge(-1)
		}
		if pr.Addr != nil {
			// A connection to the delegate carried the call: whatever the
			// message says, it may have been received.
			ce.NotSent = false
		}
		return nil, ce
	}
	return resp.GetResult(), nil
}

// serving asks grpc.health.v1 about service "": NOT_SERVING is not
// serving; a delegate without the health service (UNIMPLEMENTED) or with
// another answer serves; a call that did not reach it (connection
// refused, no answer in time) is unreachable.
func (g *grpcTransport) serving(ctx context.Context) health {
	resp, err := g.health.Check(ctx, &healthpb.HealthCheckRequest{Service: ""})
	switch {
	case err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_NOT_SERVING:
		return healthNotServing
	case err == nil:
		return healthServing
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded:
		return healthUnreachable
	}
	return healthServing // it answered, without a health service of its own
}

func (g *grpcTransport) close() error { return g.conn.Close() }

// tooLarge reports whether ce is gRPC's own refusal of a response over the
// receive limit (not a delegate's RESOURCE_EXHAUSTED, which may pass).
func tooLarge(ce *controls.CallError) bool {
	return ce.Code == codes.ResourceExhausted &&
		(strings.HasPrefix(ce.Message, "grpc: received message larger than max") ||
			strings.HasPrefix(ce.Message, "grpc: received message after decompression larger than max"))
}
