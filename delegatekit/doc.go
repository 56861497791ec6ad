// Package delegatekit writes a Stubborn delegate in a handful of lines.
//
// A delegate is a gRPC service implementing stubborn.v1.DelegateService:
// Stubborn calls its Execute once per attempt of a run. With delegatekit the
// delegate is a [Func], and main is one line (the package example is a
// whole program, client included):
//
//	func execute(ctx context.Context, req *stubbornv1.ExecuteRequest) (*stubbornv1.Result, error) {
//		if overloaded() {
//			return nil, delegatekit.RetryAfter(2*time.Second, "overloaded, try again in 2s")
//		}
//		return &stubbornv1.Result{Text: "done: " + req.GetBrief()}, nil
//	}
//
//	func main() { delegatekit.Main(execute) }
//
// [Main] listens on -listen (or :$PORT), serves the DelegateService, the
// grpc.health.v1 health service and server reflection, and stops gracefully
// on SIGINT or SIGTERM. [Serve] and [ListenAndServe] do the same under a
// context of yours, [NewServer] lets you add services before serving, and
// [Register] puts the DelegateService on a *grpc.Server you already have.
//
// # Streaming the answer
//
// A Func that makes its answer piece by piece (a model's tokens) calls
// [Send] with each piece: the kit serves ExecuteStream too, so a run's
// watchers see the text as it grows and the run's first_output_timeout and
// idle_timeout catch a stall. Return a Result with no text and the pieces
// joined are its text. The same Func answers Execute as well, with the
// pieces joined.
//
//	func execute(ctx context.Context, req *stubbornv1.ExecuteRequest) (*stubbornv1.Result, error) {
//		for _, word := range strings.Fields("one two three") {
//			if err := delegatekit.Send(ctx, word+" "); err != nil {
//				return nil, err
//			}
//		}
//		return nil, nil
//	}
//
// # Telling Stubborn what to do with a failure
//
// The error a Func returns is what Stubborn's retry control sees. Build it
// with the helpers of this package, which return gRPC status errors carrying
// the details Stubborn reads (google.rpc.RetryInfo, stubborn.v1.UpstreamStatus):
//
//   - [Transient]: UNAVAILABLE; retried after the run's own backoff.
//   - [RetryAfter]: UNAVAILABLE with a RetryInfo; retried after that delay
//     instead of the backoff (a delay over the run's max_wait ends the
//     retries).
//   - [DoNotRetry]: UNAVAILABLE with a negative RetryInfo; not retried.
//   - [Permanent]: FAILED_PRECONDITION; not retried.
//   - [Upstream] and [UpstreamRetryAfter]: the HTTP status the service behind
//     the delegate answered, as an UpstreamStatus detail and as the gRPC code
//     [CodeForHTTP] maps it to. Stubborn retries 408, 425, 429 and 5xx, and
//     no other 4xx, whatever the code. [ParseRetryAfter] reads an HTTP
//     Retry-After header for UpstreamRetryAfter.
//
// Any status error (status.Error…) reaches Stubborn as it is, and an error
// wrapping one as that status with the wrapping text as its message. Any
// other error becomes UNKNOWN with its text, which Stubborn does not retry,
// except context errors: context.DeadlineExceeded becomes DEADLINE_EXCEEDED
// (retried) and context.Canceled CANCELLED (not retried). A panic in a Func
// becomes INTERNAL "delegate panicked"; the panic and its stack go to the log
// ([WithLogger]), not to the caller. A nil Result is an empty answer, which
// is still a success.
package delegatekit
