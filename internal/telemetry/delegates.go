package telemetry

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
)

// Delegates wraps d so that each attempt's call runs inside the attempt's
// span: the span ObserveRun's event handler starts at attempt_started (or
// this wrapper, if the call comes first), a child of the run span. The
// delegate call's otelgrpc client span is then the attempt span's child, and
// the delegate gets that trace context. A judge's or an analyst's call about
// an attempt (same attempt number, another delegate, or a second call) runs
// under the attempt span too but does not count as the attempt. A call is
// matched to its run by its RunID; calls of no run ObserveRun is observing
// pass through unchanged.
func (t *Telemetry) Delegates(d controls.Delegates) controls.Delegates {
	return &tracedDelegates{t: t, next: d}
}

type tracedDelegates struct {
	t    *Telemetry
	next controls.Delegates
}

var _ controls.Delegates = (*tracedDelegates)(nil)

func (d *tracedDelegates) Call(ctx context.Context, c controls.Call) (*stubbornv1.Result, error) {
	rs := d.t.liveRun(c.RunID)
	if rs == nil {
		return d.next.Call(ctx, c)
	}
	span, own := rs.beginCall(c)
	if span != nil {
		ctx = trace.ContextWithSpan(ctx, span)
	}
	var out *outputSeen
	if own && c.Output != nil {
		out = &outputSeen{t: d.t, ctx: ctx, delegate: c.Delegate, start: time.Now(), next: c.Output}
		c.Output = out.piece
	}
	res, err := d.next.Call(ctx, c)
	if own {
		rs.endCall(c.Attempt, err)
	}
	if out != nil && span != nil && out.chunks > 0 {
		// The delegates layer hands pieces on only while Call runs.
		span.SetAttributes(
			attribute.Float64("stubborn.attempt.first_output_s", out.first.Seconds()),
			attribute.Int("stubborn.attempt.output_chunks", out.chunks),
		)
	}
	return res, err
}

// outputSeen times an attempt's streamed output: its time to first output
// (recorded in stubborn.attempt.first_output) and its pieces. Its pieces
// come one at a time (controls.Call.Output).
type outputSeen struct {
	t        *Telemetry
	ctx      context.Context
	delegate string
	start    time.Time
	next     func(string)
	chunks   int
	first    time.Duration
}

func (o *outputSeen) piece(text string) {
	if o.chunks == 0 {
		o.first = time.Since(o.start)
		o.t.m.firstOutput.Record(o.ctx, o.first.Seconds(), metric.WithAttributeSet(attribute.NewSet(delegateKey.String(o.delegate))))
	}
	o.chunks++
	o.next(text)
}

func (d *tracedDelegates) Info(name string) controls.DelegateInfo { return d.next.Info(name) }

func (d *tracedDelegates) Serving(ctx context.Context, name string) bool {
	return d.next.Serving(ctx, name)
}
