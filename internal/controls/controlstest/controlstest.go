// Package controlstest provides a fake clock, scripted fake delegates and an
// event recorder for testing controls in milliseconds, deterministically.
package controlstest

import (
	"context"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
)

// Clock is a fake controls.Clock: Sleep returns at once (unless ctx is
// already done) and moves Now forward by the slept duration. Every sleep is
// recorded.
type Clock struct {
	mu     sync.Mutex
	now    time.Time
	sleeps []time.Duration
	// Block, when set, makes Sleep wait on ctx instead of returning: for
	// tests of timeouts that must never fire on their own.
	Block bool
}

// NewClock returns a fake clock set to a fixed instant.
func NewClock() *Clock {
	return &Clock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
}

// Now returns the fake time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Sleep records d and advances the clock by it.
func (c *Clock) Sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d >= controls.Forever {
		<-ctx.Done() // a decision without timeout: not a sleep that ends
		return ctx.Err()
	}
	c.mu.Lock()
	block := c.Block
	c.sleeps = append(c.sleeps, d)
	if !block {
		c.now = c.now.Add(d)
	}
	c.mu.Unlock()
	if block {
		<-ctx.Done()
		return ctx.Err()
	}
	return nil
}

// Sleeps returns every duration slept so far, in order.
func (c *Clock) Sleeps() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Duration(nil), c.sleeps...)
}

// ManualClock is a fake controls.Clock whose time moves only when the test
// says so: Sleep waits until Advance has moved Now to the sleep's end (or
// ctx ends). For tests of what happens before and after a wait that runs
// beside other work, such as a hedged race's delay.
type ManualClock struct {
	mu      sync.Mutex
	now     time.Time
	sleeps  []*manualSleep
	changed chan struct{} // closed and replaced when sleeps changes
}

type manualSleep struct {
	until time.Time
	wake  chan struct{}
}

// NewManualClock returns a manual clock set to the instant NewClock's
// starts at.
func NewManualClock() *ManualClock {
	return &ManualClock{now: NewClock().Now(), changed: make(chan struct{})}
}

// Now returns the fake time.
func (c *ManualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Sleep waits until Advance reaches now+d, or returns ctx.Err() as soon as
// ctx is done. A sleep of d <= 0 returns at once.
func (c *ManualClock) Sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d <= 0 {
		return nil
	}
	if d >= controls.Forever {
		<-ctx.Done() // a decision without timeout: not a sleep that ends
		return ctx.Err()
	}
	c.mu.Lock()
	s := &manualSleep{until: c.now.Add(d), wake: make(chan struct{})}
	c.sleeps = append(c.sleeps, s)
	c.changedLocked()
	c.mu.Unlock()
	select {
	case <-s.wake:
		return nil
	case <-ctx.Done():
		c.mu.Lock()
		defer c.mu.Unlock()
		for i, x := range c.sleeps {
			if x == s {
				c.sleeps = append(c.sleeps[:i], c.sleeps[i+1:]...)
				c.changedLocked()
				break
			}
		}
		return ctx.Err()
	}
}

// Advance moves the time forward by d and wakes the sleeps that end by
// then.
func (c *ManualClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	kept := c.sleeps[:0]
	for _, s := range c.sleeps {
		if s.until.After(c.now) {
			kept = append(kept, s)
		} else {
			close(s.wake)
		}
	}
	c.sleeps = kept
	c.changedLocked()
}

// Sleeping returns the ends of the sleeps in progress, in the order they
// started.
func (c *ManualClock) Sleeping() []time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]time.Time, 0, len(c.sleeps))
	for _, s := range c.sleeps {
		out = append(out, s.until)
	}
	return out
}

// WaitSleeping waits until n sleeps are in progress and returns their
// ends, or returns ctx.Err() when ctx ends first.
func (c *ManualClock) WaitSleeping(ctx context.Context, n int) ([]time.Time, error) {
	for {
		c.mu.Lock()
		changed := c.changed
		if len(c.sleeps) == n {
			defer c.mu.Unlock()
			out := make([]time.Time, 0, n)
			for _, s := range c.sleeps {
				out = append(out, s.until)
			}
			return out, nil
		}
		c.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

func (c *ManualClock) changedLocked() {
	close(c.changed)
	c.changed = make(chan struct{})
}

// Reply is one scripted answer of a fake delegate.
type Reply struct {
	// Text is the result text when Err is nil.
	Text string
	// Err is returned instead of a result when set.
	Err error
	// Hang makes the call block until its context ends, then return the
	// context's error.
	Hang bool
	// HangForever makes the call block and ignore its context (a badly
	// behaved delegate). Release with Delegates.Release.
	HangForever bool
	// Chunks are streamed to the call's Output, in order, before the
	// reply (an answer, an error or a hang): a delegate that streams.
	// The answer's text, when Text is empty, is the chunks joined.
	Chunks []string
	// Deltas are streamed to the call's Deltas, in order, after Chunks:
	// a model that streams tool calls or several choices.
	Deltas [][]*stubbornv1.OutputDelta
	// Result, when set, is the answer (a model's, with choices), in
	// place of Text.
	Result *stubbornv1.Result
}

// Fail returns a Reply failing with a classified call error.
func Fail(code codes.Code, msg string) Reply {
	return Reply{Err: &controls.CallError{Code: code, Message: msg}}
}

// OK returns a Reply answering text.
func OK(text string) Reply { return Reply{Text: text} }

// Delegates is a set of scripted fake delegates. Each delegate answers its
// replies in order and repeats the last one when they run out.
type Delegates struct {
	mu         sync.Mutex
	script     map[string][]Reply
	info       map[string]controls.DelegateInfo
	notServing map[string]bool
	calls      []controls.Call
	release    chan struct{}
	once       sync.Once
}

// NewDelegates returns fake delegates with the given scripts.
func NewDelegates(script map[string][]Reply) *Delegates {
	return &Delegates{
		script:     script,
		info:       map[string]controls.DelegateInfo{},
		notServing: map[string]bool{},
		release:    make(chan struct{}),
	}
}

// SetInfo declares a delegate's registry properties.
func (d *Delegates) SetInfo(name string, info controls.DelegateInfo) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.info[name] = info
}

// SetNotServing makes the delegate's health check report NOT_SERVING.
func (d *Delegates) SetNotServing(name string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.notServing[name] = true
}

// Release unblocks every HangForever call.
func (d *Delegates) Release() { d.once.Do(func() { close(d.release) }) }

// Calls returns every call made so far, in order, each without its
// Output (a function, which would not compare).
func (d *Delegates) Calls() []controls.Call {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]controls.Call(nil), d.calls...)
}

// CallsTo returns the calls made to one delegate.
func (d *Delegates) CallsTo(name string) []controls.Call {
	var out []controls.Call
	for _, c := range d.Calls() {
		if c.Delegate == name {
			out = append(out, c)
		}
	}
	return out
}

// Call answers with the delegate's next scripted reply.
func (d *Delegates) Call(ctx context.Context, c controls.Call) (*stubbornv1.Result, error) {
	d.mu.Lock()
	kept := c
	kept.Output, kept.Deltas = nil, nil // functions: calls are compared
	d.calls = append(d.calls, kept)
	replies := d.script[c.Delegate]
	var r Reply
	switch len(replies) {
	case 0:
		d.mu.Unlock()
		return nil, &controls.CallError{Code: codes.NotFound, Message: "no script for " + c.Delegate}
	case 1:
		r = replies[0]
	default:
		r = replies[0]
		d.script[c.Delegate] = replies[1:]
	}
	d.mu.Unlock()
	for _, chunk := range r.Chunks {
		if c.Output != nil {
			c.Output(chunk)
		}
	}
	for _, ds := range r.Deltas {
		if c.Deltas != nil {
			c.Deltas(ds)
		}
	}
	if r.Text == "" && r.Err == nil {
		r.Text = strings.Join(r.Chunks, "")
	}
	switch {
	case r.HangForever:
		<-d.release
		return nil, context.Canceled
	case r.Hang:
		<-ctx.Done()
		return nil, ctx.Err()
	case r.Err != nil:
		return nil, r.Err
	case r.Result != nil:
		return r.Result, nil
	}
	return &stubbornv1.Result{Text: r.Text}, nil
}

// Info returns what SetInfo declared.
func (d *Delegates) Info(name string) controls.DelegateInfo {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.info[name]
}

// Serving reports false only for delegates marked with SetNotServing.
func (d *Delegates) Serving(_ context.Context, name string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return !d.notServing[name]
}

// Events collects the events a Tracker emits.
type Events struct {
	mu  sync.Mutex
	evs []*stubbornv1.RunEvent
}

// Sink is a controls.Sink that records into e.
func (e *Events) Sink(ev *stubbornv1.RunEvent) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.evs = append(e.evs, ev)
}

// All returns the recorded events.
func (e *Events) All() []*stubbornv1.RunEvent {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]*stubbornv1.RunEvent(nil), e.evs...)
}

// Kinds returns the recorded events' kinds as short names such as
// "attempt_started", in order.
func (e *Events) Kinds() []string {
	var out []string
	for _, ev := range e.All() {
		out = append(out, Kind(ev))
	}
	return out
}

// Kind names an event's kind.
func Kind(ev *stubbornv1.RunEvent) string {
	switch ev.GetKind().(type) {
	case *stubbornv1.RunEvent_RunStarted:
		return "run_started"
	case *stubbornv1.RunEvent_AttemptStarted:
		return "attempt_started"
	case *stubbornv1.RunEvent_AttemptFinished:
		return "attempt_finished"
	case *stubbornv1.RunEvent_FailureAnalyzed:
		return "failure_analyzed"
	case *stubbornv1.RunEvent_BackoffScheduled:
		return "backoff_scheduled"
	case *stubbornv1.RunEvent_DecisionRequested:
		return "decision_requested"
	case *stubbornv1.RunEvent_DecisionReceived:
		return "decision_received"
	case *stubbornv1.RunEvent_RunFinished:
		return "run_finished"
	case *stubbornv1.RunEvent_RunResumed:
		return "run_resumed"
	case *stubbornv1.RunEvent_AttemptOutput:
		return "attempt_output"
	}
	return "unknown"
}

// NewEnv returns an Env over fake delegates and a fake clock, with a tracker
// that records into events, for the task brief.
func NewEnv(d *Delegates, clock *Clock, events *Events, brief string) *controls.Env {
	st := &stubbornv1.ControlState{RunId: "run-test", TaskBrief: brief, Status: stubbornv1.RunStatus_RUN_STATUS_PENDING}
	tr := controls.NewTracker(st, clock, events.Sink)
	return &controls.Env{Delegates: d, Tracker: tr, Clock: clock}
}

// Standings is a fake of the guards a balance control asks how delegates
// stand (controls.Standings): the test sets each delegate's standing, and
// every call is admitted. A delegate not set stands with all its room.
type Standings struct {
	mu sync.Mutex
	by map[string]controls.Standing
}

var (
	_ controls.Standings = (*Standings)(nil)
	_ controls.Guards    = (*Standings)(nil)
)

// NewStandings returns fake standings with none set.
func NewStandings() *Standings {
	return &Standings{by: map[string]controls.Standing{}}
}

// Set sets the delegate's standing.
func (s *Standings) Set(delegate string, st controls.Standing) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.by[delegate] = st
}

// Standing returns what Set set, else Standing{Room: 1}.
func (s *Standings) Standing(delegate string) controls.Standing {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st, ok := s.by[delegate]; ok {
		return st
	}
	return controls.Standing{Room: 1}
}

// Admit admits every call.
func (s *Standings) Admit(ctx context.Context, _ string) (func(*stubbornv1.Result, error) string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return func(*stubbornv1.Result, error) string { return "" }, nil
}
