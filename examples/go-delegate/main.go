// Command go-delegate is a Stubborn delegate written with delegatekit. The
// first attempt of each run is turned away as its upstream's HTTP 429 with a
// one-second Retry-After; the next attempt answers.
//
//	go run ./examples/go-delegate -listen 127.0.0.1:7500
package main

import (
	"context"
	"time"

	"github.com/stubbornhq/stubborn/delegatekit"
	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// execute performs one attempt of the task in req's brief.
func execute(ctx context.Context, req *stubbornv1.ExecuteRequest) (*stubbornv1.Result, error) {
	if req.GetAttempt() == 1 {
		return nil, delegatekit.UpstreamRetryAfter(429, time.Second, "rate limited: retry in 1s")
	}
	return &stubbornv1.Result{Text: "done: " + req.GetBrief()}, nil
}

func main() { delegatekit.Main(execute) }
