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
//
// A model delegate's call (see [ModelsFrom]) also carries the GenAI
// conventions: the attempt span gets the gen_ai.* attributes of its own
// call, a judge's or an analyst's call gets a client span of its own
// ("chat <model>") with them, and every such call records the
// gen_ai.client.* metrics. Nothing of it is made when nothing is recorded.
func (t *Telemetry) Delegates(d controls.Delegates, opts ...DelegatesOption) controls.Delegates {
	td := &tracedDelegates{t: t, next: d}
	for _, o := range opts {
		o(td)
	}
	return td
}

type tracedDelegates struct {
	t    *Telemetry
	next controls.Delegates
	// models says which delegates are models; nil: none is.
	models func(delegate string) (Model, bool)
}

var _ controls.Delegates = (*tracedDelegates)(nil)

// model returns the Model of delegate when its calls are to carry the
// GenAI conventions: it is a model and something records them.
func (d *tracedDelegates) model(delegate string) (Model, bool) {
	if d.models == nil || d.t.off {
		return Model{}, false
	}
	return d.models(delegate)
}

func (d *tracedDelegates) Call(ctx context.Context, c controls.Call) (*stubbornv1.Result, error) {
	rs := d.t.liveRun(c.RunID)
	if rs == nil {
		return d.next.Call(ctx, c)
	}
	span, own := rs.beginCall(c)
	if span != nil {
		ctx = trace.ContextWithSpan(ctx, span)
	}
	model, isModel := d.model(c.Delegate)
	var start time.Time
	if isModel {
		start = time.Now()
		if !own {
			// Not the attempt's own call: its GenAI attributes are not
			// the attempt's, so it gets a span of its own.
			ctx, span = d.t.startModelSpan(ctx, model, c.Delegate)
		}
	}
	var out *outputSeen
	// Off, nothing records what the output's arrival is timed for.
	if own && !d.t.off && (c.Output != nil || c.Deltas != nil) {
		out = &outputSeen{t: d.t, ctx: ctx, delegate: c.Delegate, start: time.Now(), next: c.Output, nextDeltas: c.Deltas}
		if c.Output != nil {
			c.Output = out.piece
		}
		if c.Deltas != nil {
			c.Deltas = out.deltas
		}
	}
	res, err := d.next.Call(ctx, c)
	if own {
		rs.endCall(c.Attempt, err)
	}
	// The delegates layer hands pieces on only while Call runs: out is
	// read after it alone.
	if out != nil && span != nil && out.chunks > 0 {
		span.SetAttributes(
			attribute.Float64("stubborn.attempt.first_output_s", out.first.Seconds()),
			attribute.Int("stubborn.attempt.output_chunks", out.chunks),
		)
	}
	if isModel {
		if !d.t.off {
			call := &modelCall{model: model, res: res, err: err, took: time.Since(start), first: -1}
			if out != nil && out.seen {
				call.first = out.first
			}
			d.t.recordModelCall(ctx, span, call)
		}
		if !own {
			endModelSpan(span, err)
		}
	}
	return res, err
}

// outputSeen times an attempt's streamed output: its time to first output
// (recorded in stubborn.attempt.first_output), text or tool call delta,
// and its text's pieces. Its pieces come one at a time (controls.Call.Output
// and Deltas).
type outputSeen struct {
	t          *Telemetry
	ctx        context.Context
	delegate   string
	start      time.Time
	next       func(string)
	nextDeltas func([]*stubbornv1.OutputDelta)
	seen       bool // some output came: first is set
	chunks     int  // pieces of text
	first      time.Duration
}

func (o *outputSeen) piece(text string) {
	o.arrived()
	o.chunks++
	o.next(text)
}

func (o *outputSeen) deltas(ds []*stubbornv1.OutputDelta) {
	o.arrived()
	o.nextDeltas(ds)
}

func (o *outputSeen) arrived() {
	if o.seen {
		return
	}
	o.seen = true
	o.first = time.Since(o.start)
	o.t.m.firstOutput.Record(o.ctx, o.first.Seconds(), metric.WithAttributeSet(attribute.NewSet(delegateKey.String(o.delegate))))
}

func (d *tracedDelegates) Info(name string) controls.DelegateInfo { return d.next.Info(name) }

func (d *tracedDelegates) Serving(ctx context.Context, name string) bool {
	return d.next.Serving(ctx, name)
}
