package controls

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// balance calls the task once on one of its targets, picked by the
// strategy; after a failure the fallback chain would move on from, it
// picks the next among the targets not tried yet, by the same strategy,
// each at most once and at most max_attempts in all. A target whose
// circuit breaker is open or whose rate limits are spent is left out of
// the pick (Standings). The first accepted result wins; when no target is
// left to pick the outcome is EXHAUSTED.
//
// Every pick is recorded with its attempt (start_reason BALANCE_PICK, the
// figures in start_detail). Replayed, a pick the journal holds is taken
// from it, whatever the targets' standing is by then: a resumed run calls
// the deployments it called before, in the same order.
func balance(ctx context.Context, env *Env, taskBrief string, spec *stubbornv1.BalanceSpec) Outcome {
	b := newBalancer(env, spec)
	for b.tries < b.max {
		if ctx.Err() != nil {
			return stopped(ctx)
		}
		i, detail, ok := b.pick()
		if !ok {
			return b.noneLeft(b.tries)
		}
		n, a := b.try(ctx, i, detail, taskBrief)
		if ctx.Err() != nil {
			return stopped(ctx)
		}
		name := b.targets[i].GetName()
		if !a.failed {
			return Outcome{Status: stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, Result: a.result, Winner: name}
		}
		rec := &stubbornv1.FailureRecord{
			Attempt: n, Delegate: name, Summary: a.summary, Reason: a.reason, Path: env.Path,
			Source: failureSource(env, n, a),
		}
		// Another attempt follows when a target is left that may be
		// picked; the journal's word, when it holds this failure.
		b.again(i, a)
		rec, more := env.analysed(rec, func(*stubbornv1.FailureRecord) bool { return b.tries < b.max && b.anyLeft() })
		next := ""
		if more {
			next = taskBrief
		}
		env.Tracker.Failure(rec, more, next)
		if !more {
			break
		}
	}
	return b.exhausted()
}

// balancer is one balance's state.
type balancer struct {
	env      *Env
	targets  []*stubbornv1.BalanceTarget
	strategy stubbornv1.BalanceStrategy
	max      int
	tried    []bool
	tries    int
	// forgiven counts the interrupted attempts not counted as tries
	// (again).
	forgiven int
	// left is why the last pick left targets out, in words ("b (circuit
	// breaker open)").
	left []string
}

func newBalancer(env *Env, spec *stubbornv1.BalanceSpec) *balancer {
	targets := spec.GetTargets()
	b := &balancer{env: env, targets: targets, strategy: spec.GetStrategy(), max: len(targets), tried: make([]bool, len(targets))}
	if spec.MaxAttempts != nil && int(spec.GetMaxAttempts()) < b.max && spec.GetMaxAttempts() > 0 {
		b.max = int(spec.GetMaxAttempts())
	}
	return b
}

// try makes the attempt of target i: a skip when its health check says
// NOT_SERVING (as the chain's), else its call, with the pick's words.
func (b *balancer) try(ctx context.Context, i int, detail, brief string) (int32, attemptResult) {
	b.tried[i] = true
	b.tries++
	env, name := b.env, b.targets[i].GetName()
	reason := stubbornv1.AttemptStartReason_ATTEMPT_START_REASON_BALANCE_PICK
	if !env.serving(ctx, name) {
		n := env.Tracker.beginAttempt(env.Path, name, brief, 0, reason, detail)
		const why = "skipped: health check reports NOT_SERVING"
		env.Tracker.EndAttempt(n, stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_SKIPPED, nil, nil, why)
		return n, attemptResult{outcome: stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_SKIPPED, failed: true, reason: why, summary: "Skipped: NOT_SERVING"}
	}
	if err := env.mayCall(ctx, name, brief, 1); err != nil {
		return 0, attemptResult{outcome: stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_CANCELLED, err: err, failed: true, reason: "cancelled", summary: "Error: cancelled"}
	}
	n := env.Tracker.beginAttempt(env.Path, name, brief, 0, reason, detail)
	a := env.answer(ctx, n, fmt.Sprintf("targets[%d]", i), name, brief)
	endAttempt(env, n, a)
	return n, a
}

// again makes target i, whose attempt a failed, one to pick again when
// the call was interrupted (the server driving the run stopped, or lost
// it, during the call) and the delegate may be asked twice (idempotent or
// read_only): the deployment did not fail, and the attempt counts neither
// as its one try nor toward max_attempts. At most one interruption a
// target is forgiven, so that a run taken over again and again still ends.
func (b *balancer) again(i int, a attemptResult) {
	if a.outcome != stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_INTERRUPTED || b.forgiven >= len(b.targets) {
		return
	}
	if info := b.env.Delegates.Info(b.targets[i].GetName()); !info.Idempotent && !info.ReadOnly {
		return
	}
	b.forgiven++
	b.tried[i] = false
	b.tries--
}

// exhausted is the outcome once the attempts allowed were made and failed.
func (b *balancer) exhausted() Outcome {
	if b.tries < len(b.targets) && b.tries >= b.max {
		return exhausted("%d of the balance's %d targets tried (max_attempts), all failed", b.tries, len(b.targets))
	}
	if len(b.left) > 0 {
		return b.noneLeft(b.tries)
	}
	if b.tries == 1 {
		return exhausted("the balance's one target failed")
	}
	return exhausted("all %d targets of the balance failed", b.tries)
}

// noneLeft is the outcome when no target is left to pick after tries
// attempts: each one not tried was left out (b.left says why).
func (b *balancer) noneLeft(tries int) Outcome {
	why := "none could take the call: " + strings.Join(b.left, ", ")
	if tries == 0 {
		return exhausted("no target of the balance was called: %s", why)
	}
	if tries == 1 {
		return exhausted("1 target of the balance failed and %s", why)
	}
	return exhausted("%d targets of the balance failed and %s", tries, why)
}

// anyLeft reports whether a target not tried yet may be picked now.
func (b *balancer) anyLeft() bool {
	var ok []int
	ok, b.left = b.eligible(b.standings())
	return len(ok) > 0
}

// pick returns the next target: the journal's pick when it holds it,
// else the strategy's among the targets that may take the call, with the
// words that say why (Attempt.start_detail). ok is false when none may.
func (b *balancer) pick() (i int, detail string, ok bool) {
	if name, ok := b.env.Tracker.nextPick(b.env.Path); ok {
		for i, t := range b.targets {
			if t.GetName() == name && !b.tried[i] {
				return i, "", true // the journal's detail is kept with its attempt
			}
		}
		// Not one of the targets left: the strategy picks, and the
		// tracker ends the run as a replay that went another way.
	}
	st := b.standings()
	cands, left := b.eligible(st)
	b.left = left
	if len(cands) == 0 {
		return -1, "", false
	}
	i, detail = b.choose(cands, st)
	if len(left) > 0 {
		detail += "; left out: " + strings.Join(left, ", ")
	}
	return i, Cut(detail, MaxReasonBytes), true
}

// standings returns each target's standing now. A preset has none of its
// own: it stands as the average of the delegates among the targets, so
// that it is never left out nor favoured for want of figures.
func (b *balancer) standings() []Standing {
	src := b.env.standings()
	out := make([]Standing, len(b.targets))
	var sum Standing
	var delegates, measured int
	presets := make([]bool, len(b.targets))
	for i, t := range b.targets {
		if _, isPreset := b.env.preset(t.GetName()); isPreset || src == nil {
			presets[i] = true
			continue
		}
		out[i] = src.Standing(t.GetName())
		delegates++
		sum.InFlight += out[i].InFlight
		sum.Room += out[i].Room
		if out[i].Latency > 0 {
			measured++
			sum.Latency += out[i].Latency
		}
	}
	neutral := Standing{Room: 1}
	if delegates > 0 {
		neutral = Standing{InFlight: sum.InFlight / delegates, Room: sum.Room / float64(delegates)}
	}
	if measured > 0 {
		neutral.Latency = sum.Latency / time.Duration(measured)
	}
	for i := range out {
		if presets[i] {
			out[i] = neutral
		}
	}
	return out
}

// eligible returns the targets not tried yet that may take the call, and
// why each other one not tried is left out.
func (b *balancer) eligible(st []Standing) (cands []int, left []string) {
	for i, t := range b.targets {
		switch {
		case b.tried[i]:
		case st[i].Open:
			left = append(left, t.GetName()+" (circuit breaker open)")
		case st[i].Room <= 0:
			left = append(left, t.GetName()+" (rate limits spent)")
		default:
			cands = append(cands, i)
		}
	}
	return cands, left
}

// choose picks among cands by the strategy and says why.
func (b *balancer) choose(cands []int, st []Standing) (int, string) {
	switch b.strategy {
	case stubbornv1.BalanceStrategy_BALANCE_STRATEGY_LEAST_BUSY:
		return b.best(cands, "least_busy", func(i int) float64 { return float64(st[i].InFlight) },
			func(i int) string { return fmt.Sprintf("%d in flight", st[i].InFlight) })
	case stubbornv1.BalanceStrategy_BALANCE_STRATEGY_LATENCY:
		return b.best(cands, "latency", func(i int) float64 { return float64(st[i].Latency) }, func(i int) string {
			if st[i].Latency <= 0 {
				return "not measured yet"
			}
			return st[i].Latency.Round(time.Millisecond).String() + " recent latency"
		})
	case stubbornv1.BalanceStrategy_BALANCE_STRATEGY_USAGE:
		return b.best(cands, "usage", func(i int) float64 { return -st[i].Room },
			func(i int) string { return fmt.Sprintf("%.0f%% of its rate limits left", 100*st[i].Room) })
	}
	i := b.draw(cands)
	total := 0
	for _, c := range cands {
		total += b.weight(c)
	}
	return i, fmt.Sprintf("balance weighted: weight %d of %d", b.weight(i), total)
}

// best picks the candidate with the lowest figure (ties drawn by weight)
// and says its figure beside the others'.
func (b *balancer) best(cands []int, strategy string, figure func(i int) float64, say func(i int) string) (int, string) {
	low := figure(cands[0])
	for _, c := range cands[1:] {
		low = min(low, figure(c))
	}
	var tied []int
	for _, c := range cands {
		if figure(c) == low {
			tied = append(tied, c)
		}
	}
	i := tied[0]
	if len(tied) > 1 {
		i = b.draw(tied)
	}
	var others []string
	for _, c := range cands {
		if c != i {
			others = append(others, b.targets[c].GetName()+" "+say(c))
		}
	}
	detail := fmt.Sprintf("balance %s: %s", strategy, say(i))
	if len(others) > 0 {
		detail += " (others " + strings.Join(others, ", ") + ")"
	}
	if len(tied) > 1 {
		detail += fmt.Sprintf("; a tie of %d drawn by weight", len(tied))
	}
	return i, detail
}

// draw picks one of cands at random in proportion to their weights, with
// the run's randomness (Env.Rand, as a backoff's jitter).
func (b *balancer) draw(cands []int) int {
	total := 0
	for _, c := range cands {
		total += b.weight(c)
	}
	var r int
	if b.env.Rand == nil {
		r = rand.IntN(total)
	} else {
		r = b.env.Rand.IntN(total)
	}
	for _, c := range cands {
		if r -= b.weight(c); r < 0 {
			return c
		}
	}
	return cands[len(cands)-1]
}

// weight is target i's weight: 1 when unset (the server refuses one below
// 1).
func (b *balancer) weight(i int) int {
	return max(int(b.targets[i].GetWeight()), 1)
}

// standings returns what tells how delegates stand: the guards', else the
// delegates', else nil.
func (e *Env) standings() Standings {
	if s, ok := e.Guards.(Standings); ok {
		return s
	}
	if s, ok := e.Delegates.(Standings); ok {
		return s
	}
	return nil
}
