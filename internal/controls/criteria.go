package controls

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"sync"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// judgeResultChars is how much of a result the judge sees: the reference's
// String(result).slice(0, 2000), in characters.
const judgeResultChars = 2000

// wording selects the judge's brief, which differs between the controls'
// reference texts.
type wording int

const (
	// wordingRetryWithLearning is spec/retry-with-learning.md's evalBrief:
	// the criteria on the question's line.
	wordingRetryWithLearning wording = iota
	// wordingFallbackChain is spec/fallback-chain.md's evalBrief: the
	// criteria on a line of their own.
	wordingFallbackChain
	// wordingRace asks whether the result satisfies the acceptance criteria
	// and wants "is_acceptable" back; otherwise worded like fallback-chain.
	wordingRace
)

// field is the JSON field the judge answers with.
func (w wording) field() string {
	if w == wordingRace {
		return "is_acceptable"
	}
	return "is_failure"
}

// judgeBrief is the brief the judge gets for a result, byte for byte the
// reference's evalBrief for the control's wording.
func judgeBrief(w wording, criteria string, r *stubbornv1.Result) string {
	result := FirstChars(ResultString(r), judgeResultChars)
	switch w {
	case wordingFallbackChain:
		return "Does this result satisfy the failure criteria?\n\nCriteria: \"" + criteria + "\"\n\nResult:\n" + result +
			"\n\nRespond with JSON: { \"is_failure\": true/false, \"reason\": \"...\" }"
	case wordingRace:
		return "Does this result satisfy the acceptance criteria?\n\nCriteria: \"" + criteria + "\"\n\nResult:\n" + result +
			"\n\nRespond with JSON: { \"is_acceptable\": true/false, \"reason\": \"...\" }"
	default:
		return "Does this result satisfy the failure criteria? Criteria: \"" + criteria + "\"\n\nResult:\n" + result +
			"\n\nRespond with JSON: { \"is_failure\": true/false, \"reason\": \"...\" }"
	}
}

// The reference's /\{[\s\S]*"is_failure"[\s\S]*\}/: greedy, from the first
// "{" that can start a match to the last "}".
var (
	failureJSON    = regexp.MustCompile(`\{[\s\S]*"is_failure"[\s\S]*\}`)
	acceptableJSON = regexp.MustCompile(`\{[\s\S]*"is_acceptable"[\s\S]*\}`)
)

// judgeCriteria is failure criteria in natural language, judged by a judge delegate
// (failure_criteria, acceptance_criteria). The judge call is not an attempt:
// it is not recorded in the attempt log. Safe for concurrent use.
type judgeCriteria struct {
	// Delegates reaches the judge.
	Delegates Delegates
	// Name is the judge delegate's registry name.
	Name string
	// Criteria is the natural-language criteria.
	Criteria string
	// Wording selects the brief and the answer's field.
	Wording wording
}

// Check sends the judge the reference brief and reads its answer:
//
//   - is_failure true (is_acceptable false): the result fails with the
//     judge's reason, verbatim.
//   - is_failure false (is_acceptable true): accepted.
//   - the strings "true" and "false" (any case, trimmed) count as booleans.
//   - anything else, including no JSON object: accepted (fail open), with a
//     note that the judge's answer could not be read.
//   - the judge call fails: a *criteriaError `judge "<name>" failed:
//     <message>`, so the attempt fails with it.
func (j *judgeCriteria) Check(ctx context.Context, attempt int32, _ string, r *stubbornv1.Result) (Verdict, error) {
	brief := judgeBrief(j.Wording, j.Criteria, r)
	res, err := j.Delegates.Call(ctx, Call{Delegate: j.Name, Brief: brief, Attempt: attempt})
	var calls []*stubbornv1.CallCost
	if cc := callCost(j.Delegates, j.Name, res, err, int64(len(brief))); cc != nil {
		calls = []*stubbornv1.CallCost{cc}
	}
	if err != nil {
		msg := Message(err)
		if ctx.Err() != nil {
			msg = "cancelled"
		}
		return Verdict{}, &criteriaError{
			Source: stubbornv1.FailureSource_FAILURE_SOURCE_JUDGE,
			Msg:    fmt.Sprintf("judge %q failed: %s", j.Name, msg),
			Calls:  calls,
		}
	}
	answer := ResultString(res)
	value, reason, ok := readJudgeAnswer(j.Wording, answer)
	if !ok {
		return Verdict{Note: fmt.Sprintf("judge %q's answer could not be read, so the result was accepted (fail open): %q",
			j.Name, FirstChars(answer, 200)), Calls: calls}, nil
	}
	failed := value
	if j.Wording == wordingRace {
		failed = !value // is_acceptable
	}
	if !failed {
		return Verdict{Note: fmt.Sprintf("judge %q accepted the result", j.Name), Calls: calls}, nil
	}
	if reason == "" {
		reason = fmt.Sprintf("judge %q gave no reason", j.Name)
	}
	return Verdict{Failed: true, Reason: reason, Note: fmt.Sprintf("judge %q rejected the result", j.Name), Calls: calls}, nil
}

// readJudgeAnswer finds the JSON object with the wording's field in a
// judge's answer and returns the field's boolean value and the reason. ok
// is false when the answer cannot be read.
func readJudgeAnswer(w wording, answer string) (value bool, reason string, ok bool) {
	re := failureJSON
	if w == wordingRace {
		re = acceptableJSON
	}
	m := re.FindString(answer)
	if m == "" {
		return false, "", false
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal([]byte(m), &obj); err != nil {
		return false, "", false
	}
	raw, found := obj[w.field()]
	if !found || string(raw) == "null" {
		return false, "", false
	}
	if err := json.Unmarshal(raw, &value); err != nil {
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return false, "", false
		}
		switch strings.ToLower(strings.TrimSpace(s)) {
		case "true":
			value = true
		case "false":
			value = false
		default:
			return false, "", false
		}
	}
	if rr, found := obj["reason"]; found && string(rr) != "null" {
		if json.Unmarshal(rr, &reason) != nil {
			reason = string(rr) // not a string: its JSON text
		}
	}
	return value, reason, true
}

// criteriaError is a failure of the judging itself: the judge's call failed,
// or a CEL expression could not be evaluated. The attempt fails with Msg as
// its reason.
type criteriaError struct {
	// Source is who could not judge: FAILURE_SOURCE_JUDGE or
	// FAILURE_SOURCE_CEL.
	Source stubbornv1.FailureSource
	// Msg says what went wrong, naming the judge or the field.
	Msg string
	// Calls are what the judge's call cost, when one was made.
	Calls []*stubbornv1.CallCost
}

func (e *criteriaError) Error() string { return e.Msg }

// runCriteria is the failure criteria of one run's control: the CEL
// expression first (cheap, deterministic), then the judge, and an answer
// fails when either rejects it. It remembers who rejected each attempt, for
// FailureRecord.source. Safe for concurrent use (race).
type runCriteria struct {
	expr  *Expr
	judge *judgeCriteria
	// broken, when set, fails every check: the criteria could not be built.
	broken *criteriaError

	mu      sync.Mutex
	sources map[int32]stubbornv1.FailureSource
}

// NewCriteria builds the failure criteria of a control spec, compiling its
// CEL expression once. judge names the judge delegate for natural-language
// criteria (the run's options.judge, else the server's default) and d
// reaches it. It returns nil when the spec has no criteria. It never fails:
// criteria that cannot be built (the submission checks should have
// refused them) fail every attempt with the reason why.
func NewCriteria(spec *stubbornv1.ControlSpec, judge string, d Delegates) Criteria {
	var (
		text, expr, exprField string
		w                     wording
	)
	switch k := spec.GetKind().(type) {
	case *stubbornv1.ControlSpec_RetryWithLearning:
		text, expr, exprField, w = k.RetryWithLearning.GetFailureCriteria(), k.RetryWithLearning.GetFailureWhen(), "failure_when", wordingRetryWithLearning
	case *stubbornv1.ControlSpec_FallbackChain:
		text, expr, exprField, w = k.FallbackChain.GetFailureCriteria(), k.FallbackChain.GetFailureWhen(), "failure_when", wordingFallbackChain
	case *stubbornv1.ControlSpec_Race:
		text, expr, exprField, w = k.Race.GetAcceptanceCriteria(), k.Race.GetAcceptWhen(), "accept_when", wordingRace
	case *stubbornv1.ControlSpec_Balance:
		text, expr, exprField, w = k.Balance.GetFailureCriteria(), k.Balance.GetFailureWhen(), "failure_when", wordingFallbackChain
	}
	if text == "" && expr == "" {
		return nil
	}
	c := &runCriteria{sources: map[int32]stubbornv1.FailureSource{}}
	if expr != "" {
		e, err := CompileExpr(exprField, expr)
		if err != nil {
			c.broken = &criteriaError{Source: stubbornv1.FailureSource_FAILURE_SOURCE_CEL, Msg: exprField + " does not compile: " + err.Error()}
			return c
		}
		c.expr = e
	}
	if text != "" {
		if judge == "" {
			c.broken = &criteriaError{Source: stubbornv1.FailureSource_FAILURE_SOURCE_JUDGE, Msg: "no judge delegate is configured for the failure criteria"}
			return c
		}
		c.judge = &judgeCriteria{Delegates: d, Name: judge, Criteria: text, Wording: w}
	}
	return c
}

// judgeName is the judge delegate's name; "" without one.
func (c *runCriteria) judgeName() string {
	if c.judge == nil {
		return ""
	}
	return c.judge.Name
}

// Check applies the CEL expression, then, if it passed, the judge.
func (c *runCriteria) Check(ctx context.Context, attempt int32, delegate string, r *stubbornv1.Result) (Verdict, error) {
	if c.broken != nil {
		c.record(attempt, c.broken.Source)
		return Verdict{}, c.broken
	}
	var notes []string
	if c.expr != nil {
		v, err := c.expr.Check(ctx, attempt, delegate, r)
		if err != nil || v.Failed {
			c.record(attempt, stubbornv1.FailureSource_FAILURE_SOURCE_CEL)
			return v, err
		}
		notes = append(notes, v.Note)
	}
	var calls []*stubbornv1.CallCost
	if c.judge != nil {
		v, err := c.judge.Check(ctx, attempt, delegate, r)
		if err != nil || v.Failed {
			c.record(attempt, stubbornv1.FailureSource_FAILURE_SOURCE_JUDGE)
			return v, err
		}
		notes = append(notes, v.Note)
		calls = v.Calls
	}
	return Verdict{Note: strings.Join(notes, "; "), Calls: calls}, nil
}

func (c *runCriteria) record(attempt int32, s stubbornv1.FailureSource) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sources[attempt] = s
}

// Source says who rejected an attempt: FAILURE_SOURCE_CEL or
// FAILURE_SOURCE_JUDGE, or UNSPECIFIED when these criteria did not.
func (c *runCriteria) Source(attempt int32) stubbornv1.FailureSource {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sources[attempt]
}

// failureSource says who decided that attempt n, which ended as a, failed:
// the delegate's error, a cancellation, a skip over a NOT_SERVING delegate,
// or, for a rejected answer, the criteria step that rejected it.
func failureSource(env *Env, n int32, a attemptResult) stubbornv1.FailureSource {
	switch a.outcome {
	case stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_ERROR, stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_INTERRUPTED:
		return stubbornv1.FailureSource_FAILURE_SOURCE_ERROR
	case stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_CANCELLED:
		return stubbornv1.FailureSource_FAILURE_SOURCE_CANCELLED
	case stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_SKIPPED:
		switch refusedBy(a.err) {
		case stubbornv1.RefusedBy_REFUSED_BY_CIRCUIT_BREAKER:
			return stubbornv1.FailureSource_FAILURE_SOURCE_CIRCUIT_BREAKER
		case stubbornv1.RefusedBy_REFUSED_BY_BULKHEAD:
			return stubbornv1.FailureSource_FAILURE_SOURCE_BULKHEAD
		case stubbornv1.RefusedBy_REFUSED_BY_RATE_LIMIT:
			return stubbornv1.FailureSource_FAILURE_SOURCE_RATE_LIMIT
		}
		return stubbornv1.FailureSource_FAILURE_SOURCE_HEALTH
	case stubbornv1.AttemptOutcome_ATTEMPT_OUTCOME_REJECTED:
		if s, ok := env.Criteria.(interface {
			Source(int32) stubbornv1.FailureSource
		}); ok {
			return s.Source(n)
		}
	}
	return stubbornv1.FailureSource_FAILURE_SOURCE_UNSPECIFIED
}
