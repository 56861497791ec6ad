package delegatekit_test

import (
	"context"
	"fmt"
	"log"
	"net"
	"net/http"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/stubbornhq/stubborn/delegatekit"
	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// A delegate whose first attempt of every run is turned away with a
// retry-after hint, and which answers the next one. A program would serve it
// with delegatekit.Main(execute); here it is served on loopback and called
// as Stubborn would call it.
func Example() {
	execute := func(_ context.Context, req *stubbornv1.ExecuteRequest) (*stubbornv1.Result, error) {
		if req.GetAttempt() == 1 {
			return nil, delegatekit.UpstreamRetryAfter(429, 1500*time.Millisecond, "rate limited")
		}
		return &stubbornv1.Result{Text: "answered: " + req.GetBrief()}, nil
	}

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- delegatekit.Serve(ctx, lis, execute) }()

	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	delegate := stubbornv1.NewDelegateServiceClient(conn)
	for attempt := int32(1); attempt <= 2; attempt++ {
		resp, err := delegate.Execute(ctx, &stubbornv1.ExecuteRequest{Brief: "rainfall 2026", Attempt: attempt})
		if err != nil {
			st := status.Convert(err)
			fmt.Println("attempt", attempt, "failed:", st.Code(), st.Message())
			for _, d := range st.Details() {
				switch d := d.(type) {
				case *stubbornv1.UpstreamStatus:
					fmt.Println("  upstream HTTP status:", d.GetHttpStatus())
				case *errdetails.RetryInfo:
					fmt.Println("  retry after:", d.GetRetryDelay().AsDuration())
				}
			}
			continue
		}
		fmt.Println("attempt", attempt, "succeeded:", resp.GetResult().GetText())
	}
	_ = conn.Close()
	stop()
	fmt.Println("server stopped:", <-served)
	// Output:
	// attempt 1 failed: ResourceExhausted rate limited
	//   upstream HTTP status: 429
	//   retry after: 1.5s
	// attempt 2 succeeded: answered: rainfall 2026
	// server stopped: <nil>
}

func ExampleCodeForHTTP() {
	for _, httpStatus := range []int{400, 404, 422, 429, 500, 503} {
		fmt.Println(httpStatus, delegatekit.CodeForHTTP(httpStatus))
	}
	// Output:
	// 400 InvalidArgument
	// 404 NotFound
	// 422 FailedPrecondition
	// 429 ResourceExhausted
	// 500 Internal
	// 503 Unavailable
}

// A delegate that calls an HTTP service passes its status and Retry-After
// header on to Stubborn.
func ExampleUpstreamRetryAfter() {
	// The service answered 503 Service Unavailable, Retry-After: 120.
	code, header := 503, http.Header{"Retry-After": []string{"120"}}

	err := delegatekit.Upstream(code, "search is down")
	if d, ok := delegatekit.ParseRetryAfter(header.Get("Retry-After"), time.Now()); ok {
		err = delegatekit.UpstreamRetryAfter(code, d, "search is down")
	}

	st := status.Convert(err)
	fmt.Println(st.Code(), st.Message())
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *stubbornv1.UpstreamStatus:
			fmt.Println("upstream HTTP status:", d.GetHttpStatus())
		case *errdetails.RetryInfo:
			fmt.Println("retry after:", d.GetRetryDelay().AsDuration())
		}
	}
	// Output:
	// Unavailable search is down
	// upstream HTTP status: 503
	// retry after: 2m0s
}

func ExampleParseRetryAfter() {
	now := time.Date(2026, 10, 21, 7, 28, 0, 0, time.UTC)
	for _, header := range []string{"120", "Wed, 21 Oct 2026 07:28:30 GMT", "soon"} {
		fmt.Println(delegatekit.ParseRetryAfter(header, now))
	}
	// Output:
	// 2m0s true
	// 30s true
	// 0s false
}
