package controls

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"cel.dev/cel-go/cel"
	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/ext"
	"google.golang.org/protobuf/proto"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// CEL limits, the same for every expression.
const (
	// celCostLimit stops an evaluation once it has spent this many CEL cost
	// units (about one per operation, more for string and list work: tens of
	// milliseconds at most), far more than a check of one result needs.
	celCostLimit = 100_000
	// CELMaxLength bounds an expression's length, in characters.
	CELMaxLength = 4096
	// celInterruptEvery is how many comprehension iterations run between two
	// checks of the context (a cancelled run stops its evaluation).
	celInterruptEvery = 100
)

// celEnv declares what an expression may use: result (a stubborn.v1.Result,
// so result.text is a string, result.data a JSON-like dyn, and a model's
// answer is in result.choices, result.usage and result.model, as in
// result.choices[0].message.tool_calls[0].name), attempt and
// delegate, with the standard library and the strings extension, bounded
// in memory (celbounds.go). It is built once: a cel.Env is safe for
// concurrent use.
var celEnv = sync.OnceValues(func() (*cel.Env, error) {
	return cel.NewEnv(append([]cel.EnvOption{
		cel.Types(&stubbornv1.Result{}),
		cel.Variable("result", cel.ObjectType("stubborn.v1.Result")),
		cel.Variable("attempt", cel.IntType),
		cel.Variable("delegate", cel.StringType),
		ext.Strings(),
		cel.ParserExpressionSizeLimit(CELMaxLength),
	}, celBoundOptions()...)...)
})

// Expr is a compiled failure_when or accept_when expression. It is a
// Criteria, safe for concurrent use: compile it once per run, evaluate it on
// every attempt.
type Expr struct {
	field  string // "failure_when" or "accept_when", for reasons and notes
	src    string
	accept bool // true means acceptable (accept_when), not failed
	prg    cel.Program
}

// CompileExpr compiles and type-checks src. field names the spec field
// ("failure_when" or "accept_when") and decides what true means: failed for
// failure_when, acceptable for accept_when. The expression must have type
// bool, or dyn (then a non-bool value fails the attempt when evaluated), and
// stay within the memory bounds over the largest answer (celbounds.go): one
// that may build a value over celMaxValueBytes is refused. The error is
// meant for the client. A run resumed by another server compiles its
// expression again, so one refused by these checks, accepted before they
// existed, fails its attempts with the reason instead of being evaluated.
func CompileExpr(field, src string) (*Expr, error) {
	env, err := celEnv()
	if err != nil {
		return nil, fmt.Errorf("CEL environment: %w", err)
	}
	ast, iss := env.Compile(src)
	if iss.Err() != nil {
		return nil, iss.Err()
	}
	if t := ast.OutputType(); !t.IsExactType(cel.BoolType) && !t.IsExactType(cel.DynType) {
		return nil, fmt.Errorf("must be a bool expression, but has type %s", t)
	}
	if err := checkBounds(env, ast); err != nil {
		return nil, err
	}
	return newExpr(env, ast, field, src)
}

// newExpr plans a checked expression with the cost limit.
func newExpr(env *cel.Env, ast *cel.Ast, field, src string) (*Expr, error) {
	prg, err := env.Program(ast,
		cel.CostLimit(celCostLimit),
		cel.InterruptCheckFrequency(celInterruptEvery),
	)
	if err != nil {
		return nil, err
	}
	return &Expr{field: field, src: src, accept: field == "accept_when", prg: prg}, nil
}

// Eval evaluates the expression over one answer and returns its boolean
// value. An evaluation error, a value that is not a bool, or the cost limit
// is returned as an error, and so are inputs over the bounds the
// expression was checked against (MaxResultBytes, maxDelegateNameBytes):
// they are not evaluated.
func (e *Expr) Eval(ctx context.Context, attempt int32, delegate string, r *stubbornv1.Result) (bool, error) {
	if r == nil {
		r = &stubbornv1.Result{}
	}
	if err := checkInputs(delegate, r); err != nil {
		return false, err
	}
	out, _, err := e.prg.ContextEval(ctx, map[string]any{
		"result":   r,
		"attempt":  int64(attempt),
		"delegate": delegate,
	})
	if err != nil {
		return false, err
	}
	b, ok := out.(types.Bool)
	if !ok {
		return false, fmt.Errorf("evaluated to %s, not a bool", out.Type().TypeName())
	}
	return bool(b), nil
}

// checkInputs refuses inputs over the sizes CompileExpr assumed.
func checkInputs(delegate string, r *stubbornv1.Result) error {
	if n := len(r.GetText()); n > MaxResultBytes {
		return fmt.Errorf("%w: result.text is %d bytes, more than the limit of %d", errTooLarge, n, MaxResultBytes)
	}
	if r.GetData() != nil {
		if n := proto.Size(r.GetData()); n > MaxResultBytes {
			return fmt.Errorf("%w: result.data is %d bytes, more than the limit of %d", errTooLarge, n, MaxResultBytes)
		}
	}
	if len(r.GetChoices()) > 0 {
		n := 0
		for _, c := range r.GetChoices() {
			n += proto.Size(c)
		}
		if n > MaxResultBytes {
			return fmt.Errorf("%w: result.choices are %d bytes, more than the limit of %d", errTooLarge, n, MaxResultBytes)
		}
	}
	if n := len(r.GetModel()); n > MaxResultBytes {
		return fmt.Errorf("%w: result.model is %d bytes, more than the limit of %d", errTooLarge, n, MaxResultBytes)
	}
	if n := len(delegate); n > maxDelegateNameBytes {
		return fmt.Errorf("%w: the delegate's name is %d bytes, more than the limit of %d", errTooLarge, n, maxDelegateNameBytes)
	}
	return nil
}

// Check implements Criteria. failure_when true (accept_when false) fails
// the answer with the reason "failure_when is true: <expr>" ("accept_when
// is false: <expr>"). An expression that cannot be evaluated returns an
// error, "failure_when could not be evaluated: <CEL error>", so the attempt
// fails with it.
func (e *Expr) Check(ctx context.Context, attempt int32, delegate string, r *stubbornv1.Result) (Verdict, error) {
	v, err := e.Eval(ctx, attempt, delegate, r)
	if err != nil {
		return Verdict{}, &criteriaError{
			Source: stubbornv1.FailureSource_FAILURE_SOURCE_CEL,
			Msg:    fmt.Sprintf("%s could not be evaluated: %s", e.field, celMessage(err)),
		}
	}
	if v != e.accept {
		return Verdict{
			Failed: true,
			Reason: fmt.Sprintf("%s is %t: %s", e.field, v, e.src),
			Note:   fmt.Sprintf("CEL (%s) rejected the result", e.field),
		}, nil
	}
	return Verdict{Note: fmt.Sprintf("CEL (%s) accepted the result", e.field)}, nil
}

// celMessage is a CEL evaluation error in words.
func celMessage(err error) string {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return "cancelled"
	}
	return err.Error()
}
