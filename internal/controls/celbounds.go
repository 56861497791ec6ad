package controls

import (
	"errors"
	"fmt"
	"math"
	"regexp/syntax"
	"strings"

	"cel.dev/cel-go/cel"
	"cel.dev/cel-go/common/ast"
	"cel.dev/cel-go/common/cost"
	"cel.dev/cel-go/common/overloads"
	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"
	"cel.dev/cel-go/common/types/traits"
)

// What an expression may be evaluated over, and what it may build.
//
// CEL's cost limit (celCostLimit) bounds time, not memory: it is charged
// after each call returns, so one call that builds a large value has
// allocated all of it before the limit can stop the evaluation.
// result.text.replace("", result.text + result.text) over a 60 KB answer
// asks for 7 GB in one call. Three guards bound the memory of every
// evaluation, whatever the answer:
//
//  1. At submission, CompileExpr works out, with cel-go's cost estimator
//     and the largest inputs (result.text, result.data, result.choices
//     and result.model of MaxResultBytes, delegate of
//     maxDelegateNameBytes), the largest value that each call
//     which builds one (string concatenation, replace, join, split, format,
//     strings.quote, string/bytes conversions) may return,
//     and refuses an expression in which that may exceed celMaxValueBytes.
//     It also refuses a regular expression whose program may exceed
//     celMaxRegexProgram instructions (matches compiles its pattern when
//     evaluated, before it is charged): a literal pattern is measured from
//     its syntax, without compiling it, and a pattern computed when
//     evaluated (from the answer, say) may be at most
//     celMaxRegexProgram/1000 bytes long, since a byte of pattern can
//     compile to a thousand instructions ("(a){1000}").
//  2. When evaluated, an answer over MaxResultBytes (or a delegate name over
//     maxDelegateNameBytes) is not evaluated at all, and replace and join
//     count the bytes they would build before building anything and refuse
//     more than celMaxValueBytes. These do not rely on the estimate.
//  3. format is charged for what it builds, as replace, join and
//     concatenation are (cel-go charged it for its format string only, so
//     thousands of calls that each built a copy of the answer cost next to
//     nothing): what an evaluation builds call after call adds up to at
//     most about ten characters per unit of celCostLimit.
//
// So an evaluation holds its inputs, at most one value of celMaxValueBytes
// being built when the cost limit stops it, and what the cost limit lets
// through before that: a few tens of MiB at most.
const (
	// MaxResultBytes is the largest result an expression is evaluated
	// over: result.text and result.model of at most this many bytes, and
	// result.data, and result.choices together, whose protobuf encoding is
	// at most this many bytes. Over it, the
	// evaluation fails without starting (the attempt fails with the reason).
	// Delegate answers are meant to be held to it before the criteria see
	// them.
	MaxResultBytes = 1 << 20
	// maxDelegateNameBytes is the longest delegate name an expression's
	// delegate variable may hold; over it, the evaluation fails.
	maxDelegateNameBytes = 128
	// celMaxValueBytes bounds the largest value one call of an expression
	// may build: the bytes of a string, or the elements of a list or map
	// plus the bytes of the strings in them (CEL's aggregate size).
	celMaxValueBytes = 16 << 20
	// celMaxRegexProgram bounds the program a regular expression compiles
	// to, in instructions (each some tens of bytes: about a MiB in all).
	celMaxRegexProgram = 20_000
)

// regexInstPerByte is about the most instructions one byte of a regular
// expression can compile to: Go refuses nested repetitions of more than
// 1000 in all, and each copy of a group costs about an instruction per
// byte of it ("((((((a)))))){1000}" is 13,000 instructions for 19 bytes).
const regexInstPerByte = 1000

// errTooLarge is what an evaluation that would build a value over
// celMaxValueBytes, or that was handed inputs over their bounds, fails
// with.
var errTooLarge = errors.New("too large")

// celBoundOptions are the CEL environment's options that keep an
// evaluation within the bounds above: replace and join that count before
// they build, and format charged for what it builds. They follow
// ext.Strings(), whose replace and join they replace, keeping their
// signatures and their meaning. (Not cel.RegexProgramSizeLimit: it
// measures a pattern by compiling it, which for a 4 KB literal allocates
// hundreds of MiB at submission.)
func celBoundOptions() []cel.EnvOption {
	str, list, integer := cel.StringType, cel.ListType(cel.StringType), cel.IntType
	return []cel.EnvOption{
		cel.Function("replace",
			cel.MemberOverload("string_replace_string_string", []*cel.Type{str, str, str}, str,
				cel.FunctionBinding(func(args ...ref.Val) ref.Val {
					return boundedReplace(args[0], args[1], args[2], types.Int(-1))
				})),
			cel.MemberOverload("string_replace_string_string_int", []*cel.Type{str, str, str, integer}, str,
				cel.FunctionBinding(func(args ...ref.Val) ref.Val {
					return boundedReplace(args[0], args[1], args[2], args[3])
				}))),
		cel.Function("join",
			cel.MemberOverload("list_join", []*cel.Type{list}, str,
				cel.UnaryBinding(func(l ref.Val) ref.Val { return boundedJoin(l, types.String("")) })),
			cel.MemberOverload("list_join_string", []*cel.Type{list, str}, str,
				cel.BinaryBinding(boundedJoin))),
		cel.CostModel(formatCostModel),
	}
}

// boundedReplace is ext.Strings' replace (strings.Replace: n < 0 replaces
// every match), which first counts the bytes of its result.
func boundedReplace(s, old, repl, n ref.Val) ref.Val {
	str, o, r := string(s.(types.String)), string(old.(types.String)), string(repl.(types.String))
	matches := int64(strings.Count(str, o)) // an empty old matches len(runes)+1 times
	if limit := int64(n.(types.Int)); limit >= 0 {
		matches = min(matches, limit)
	}
	if size := int64(len(str)) + matches*(int64(len(r))-int64(len(o))); size > celMaxValueBytes {
		return types.WrapErr(fmt.Errorf("%w: replace would build a string of %d bytes, more than the limit of %d", errTooLarge, size, celMaxValueBytes))
	}
	return types.String(strings.Replace(str, o, r, int(matches)))
}

// boundedJoin is ext.Strings' join, which first counts the bytes of its
// result.
func boundedJoin(l, sep ref.Val) ref.Val {
	lister, ok := l.(traits.Lister)
	if !ok {
		return types.MaybeNoSuchOverloadErr(l)
	}
	delim := string(sep.(types.String))
	n := int64(lister.Size().(types.Int))
	size := max(n-1, 0) * int64(len(delim))
	for i := int64(0); i < n; i++ {
		s, ok := lister.Get(types.Int(i)).(types.String)
		if !ok {
			return types.WrapErr(fmt.Errorf("join: invalid input: %v", lister.Get(types.Int(i))))
		}
		size += int64(len(s))
	}
	if size > celMaxValueBytes {
		return types.WrapErr(fmt.Errorf("%w: join would build a string of %d bytes, more than the limit of %d", errTooLarge, size, celMaxValueBytes))
	}
	var b strings.Builder
	b.Grow(int(size))
	for i := int64(0); i < n; i++ {
		if i > 0 {
			b.WriteString(delim)
		}
		b.WriteString(string(lister.Get(types.Int(i)).(types.String)))
	}
	return types.String(b.String())
}

// formatCostModel charges format for its format string and for the
// string it built, as string concatenation is charged.
var formatCostModel = cost.MemberOverload(overloads.ExtFormatString,
	cost.EvalCost(cost.Sum(
		cost.Const(cost.CallCost),
		cost.StringScan(cost.Length(cost.Target())),
		cost.StringScan(cost.Length(cost.Result())),
	)),
)

// The models of ext.Strings' calls that build a string or a list from
// their inputs, as cel-go's ext/strings.go defines them (v0.33.2), so that
// worstCase can see the sizes they estimate.
var (
	replaceModel = func(id string) cost.OverloadModel {
		one := cost.Const(1)
		maxSize := cost.Mul(cost.Sum(cost.Target(), one), cost.Sum(cost.Arg(1), one))
		return cost.MemberOverload(id,
			cost.EvalCost(cost.Sum(
				cost.Const(cost.CallCost),
				cost.StringScan(cost.Mul(
					cost.AtLeastOneQuantity(cost.Length(cost.Target())),
					cost.AtLeastOneQuantity(cost.Length(cost.Arg(0))),
				)),
				cost.Length(cost.Result()),
			)),
			cost.ResultSize(cost.Ranged(cost.Min(cost.Target(), cost.Arg(1)), maxSize)),
		)
	}
	joinModel = cost.MemberOverload("list_join",
		cost.EvalCost(cost.Sum(cost.Const(cost.CallCost), cost.StringScan(cost.Sum(cost.Length(cost.Target()), cost.Const(1))), cost.Length(cost.Result()))),
		cost.ResultSize(cost.AtMost(cost.ElemTotal(cost.Target()))),
	)
	joinStringModel = cost.MemberOverload("list_join_string",
		cost.EvalCost(cost.Sum(cost.Const(cost.CallCost), cost.StringScan(cost.Sum(cost.Length(cost.Target()), cost.Const(1))), cost.Length(cost.Result()))),
		cost.ResultSize(cost.AtMost(cost.Sum(
			cost.ElemTotal(cost.Target()),
			cost.Mul(cost.Length(cost.Target()), cost.Arg(0)),
		))),
	)
	splitModel = func(id string) cost.OverloadModel {
		s := cost.Target()
		return cost.MemberOverload(id,
			cost.EvalCost(cost.AllocList(
				cost.StringScan(cost.Sum(cost.Length(cost.Target()), cost.Const(1))),
				cost.Length(cost.Result()),
			)),
			cost.ResultSize(cost.Min(
				cost.List(cost.AtMost(cost.Sum(s, cost.Const(1))), cost.AtMost(s)),
				cost.Sum(cost.Scale(s, 2), cost.Const(2)),
			)),
		)
	}
)

// celSizing is how worstCase sizes values: CEL's aggregate size, the
// bytes of a string, and for a list or map one per element plus the
// elements' own sizes.
var celSizing = cost.WithSizingStrategy(cost.AggregateSizingStrategy())

// builder is how a call that builds a value from its inputs is estimated.
type builder struct {
	name string // the function, for messages
	est  cost.FunctionEstimator
}

// stdEstimators are the standard library's models, sized as worstCase
// sizes values.
var stdEstimators = cost.StandardOverloadEstimatorsWithOptions(celSizing)

// builders are the calls that build a value from their inputs, by
// overload, estimated by the standard library's and ext.Strings' models.
// Concatenating lists is not one of them: it copies no element (cel-go
// concatenates lazily, and a comprehension appends to its own list), and a
// list's elements are counted where they are made: by the calls that
// build them, or by the cost limit, which charges each step of a
// comprehension.
var builders = func() map[string]builder {
	b := map[string]builder{}
	for id, name := range map[string]string{
		overloads.AddString: "+", overloads.AddBytes: "+",
		overloads.StringToBytes: "bytes", overloads.BytesToString: "string", overloads.ExtQuoteString: "strings.quote",
	} {
		b[id] = builder{name, stdEstimators[id]}
	}
	for _, m := range []struct {
		name  string
		model cost.OverloadModel
	}{
		{"replace", replaceModel("string_replace_string_string")},
		{"replace", replaceModel("string_replace_string_string_int")},
		{"join", joinModel},
		{"join", joinStringModel},
		{"split", splitModel("string_split_string")},
		{"split", splitModel("string_split_string_int")},
	} {
		b[m.model.ID] = builder{m.name, m.model.FunctionEstimatorWithOptions(celSizing)}
	}
	b[overloads.ExtFormatString] = builder{"format", estimateFormat}
	return b
}()

// estimateFormat bounds what fmt.format(args) builds: the format string,
// plus each argument as a verb renders it. A string or bytes argument
// renders to at most twice its size (%x); any other value to at most 410
// characters per unit of its size (%f of 1e308 with the largest precision,
// 100); a list or map renders its elements that way, with separators.
func estimateFormat(e cost.Estimator, target *cost.AstNode, args []cost.AstNode) *cost.CallEstimate {
	if target == nil || len(args) != 1 {
		return nil
	}
	fmtSize := cost.EstimateSize(e, *target)
	argSize := cost.EstimateSize(e, args[0])
	perUnit := uint64(410)
	if t := args[0].Type(); t != nil && len(t.Parameters()) == 1 {
		switch t.Parameters()[0].Kind() {
		case types.StringKind, types.BytesKind:
			perUnit = 2
		}
	}
	size := cost.RangedSizeEstimate(0, cost.SafeAdd(fmtSize.Max, cost.SafeMultiply(argSize.Max, perUnit)))
	c := fmtSize.MultiplyByCostFactor(cost.StringTraversalCostFactor).
		Add(size.MultiplyByCostFactor(cost.StringTraversalCostFactor)).
		Add(cost.CallCostEstimate)
	return cost.NewCallEstimate(c, &size)
}

// worstCase is a cost.Estimator that gives the inputs' largest sizes and
// remembers the largest value a call may build, the largest program a
// literal regular expression compiles to, and the longest pattern that is
// computed rather than written out. Not safe for concurrent use: one per
// estimate.
type worstCase struct {
	largest     uint64 // the largest value a call may build
	largestCall string // which call may build it
	program     uint64 // the largest literal pattern's program, in instructions
	pattern     uint64 // the longest computed pattern, in bytes
}

// options are the estimate's options: the aggregate sizing, and the
// builders and regular expression calls, which report to w.
func (w *worstCase) options() []cost.Option {
	opts := []cost.Option{celSizing}
	for id, b := range builders {
		opts = append(opts, cost.OverloadCostEstimate(id, w.builds(b)))
	}
	for _, id := range []string{overloads.Matches, overloads.MatchesString} {
		opts = append(opts, cost.OverloadCostEstimate(id, w.matches(stdEstimators[id])))
	}
	return opts
}

// builds wraps a builder's estimator to remember the size of its result.
func (w *worstCase) builds(b builder) cost.FunctionEstimator {
	return func(e cost.Estimator, target *cost.AstNode, args []cost.AstNode) *cost.CallEstimate {
		c := b.est(e, target, args)
		size := uint64(math.MaxUint64) // no estimate: no bound
		if c != nil && c.ResultSize != nil {
			size = c.ResultSize.Max
		}
		if size > w.largest || w.largestCall == "" {
			w.largest, w.largestCall = size, b.name
		}
		return c
	}
}

// matches wraps matches' estimator to remember the program of a literal
// pattern, or how long a computed one may be.
func (w *worstCase) matches(est cost.FunctionEstimator) cost.FunctionEstimator {
	return func(e cost.Estimator, target *cost.AstNode, args []cost.AstNode) *cost.CallEstimate {
		if len(args) > 0 {
			pattern := args[len(args)-1] // matches(s, p), s.matches(p)
			lit, isLit := types.String(""), false
			if p := pattern.Expr(); p != nil && p.Kind() == ast.LiteralKind {
				lit, isLit = p.AsLiteral().(types.String)
			}
			if isLit {
				// One that does not parse fails when evaluated, having
				// compiled nothing.
				if n, err := regexProgram(string(lit)); err == nil {
					w.program = max(w.program, n)
				}
			} else {
				w.pattern = max(w.pattern, cost.EstimateSize(e, pattern).Max)
			}
		}
		return est(e, target, args)
	}
}

// regexProgram bounds the number of instructions a pattern compiles to,
// from its syntax tree, without compiling it: Go's regexp/syntax expands
// repetitions when it simplifies the tree, so a few bytes of pattern may
// compile to thousands of instructions.
func regexProgram(pattern string) (uint64, error) {
	re, err := syntax.Parse(pattern, syntax.Perl)
	if err != nil {
		return 0, err
	}
	return cost.SafeAdd(regexInstructions(re), 2), nil // fail and match
}

// regexInstructions bounds the instructions syntax.Compile emits for
// re.Simplify().
func regexInstructions(re *syntax.Regexp) uint64 {
	subs := uint64(0)
	for _, s := range re.Sub {
		subs = cost.SafeAdd(subs, regexInstructions(s))
	}
	switch re.Op {
	case syntax.OpLiteral:
		return uint64(max(len(re.Rune), 1)) // a rune each
	case syntax.OpCapture:
		return cost.SafeAdd(subs, 2) // save the start and the end
	case syntax.OpStar:
		return cost.SafeAdd(subs, 2) // (x+)? when x may be empty
	case syntax.OpPlus, syntax.OpQuest:
		return cost.SafeAdd(subs, 1)
	case syntax.OpConcat:
		return max(subs, 1)
	case syntax.OpAlternate:
		return cost.SafeAdd(subs, uint64(max(len(re.Sub)-1, 0)))
	case syntax.OpRepeat:
		// x{n,m} becomes n copies of x then m-n optional ones, x{n,} n-1
		// copies then x+, x{0,} x*: at most max(n, m) copies, each with
		// at most one more instruction.
		copies := uint64(max(re.Min, re.Max, 1))
		return cost.SafeAdd(cost.SafeMultiply(copies, cost.SafeAdd(subs, 1)), 1)
	default: // a class, an empty-width assertion, an empty match: one
		return cost.SafeAdd(subs, 1)
	}
}

// EstimateSize gives the inputs' largest sizes: result.text,
// result.model, result.data and result.choices and everything in them
// hold at most MaxResultBytes, delegate at most maxDelegateNameBytes.
func (w *worstCase) EstimateSize(n cost.AstNode) *cost.SizeEstimate {
	p := n.Path()
	switch {
	case len(p) == 0:
		return nil
	case p[0] == "delegate":
		s := cost.RangedSizeEstimate(0, maxDelegateNameBytes)
		return &s
	case p[0] != "result":
		return nil
	case len(p) == 1:
		s := cost.RangedSizeEstimate(0, 2*MaxResultBytes)
		return &s
	case p[1] == "text", p[1] == "model" && len(p) == 2:
		s := cost.RangedSizeEstimate(0, MaxResultBytes)
		return &s
	}
	// result.data or result.choices (all of them together hold at most
	// MaxResultBytes), or any part of them: a list or map of at most
	// MaxResultBytes, whose elements and keys, and the strings in them
	// (a choice's texts, a tool call's name and arguments), are no
	// larger.
	part := cost.RangedSizeEstimate(0, MaxResultBytes)
	s := cost.MapSizeEstimate(part, part, part)
	return &s
}

// EstimateCallCost leaves every call to the models.
func (*worstCase) EstimateCallCost(string, string, *cost.AstNode, []cost.AstNode) *cost.CallEstimate {
	return nil
}

// checkBounds refuses an expression that may build a value over
// celMaxValueBytes, or compute a regular expression pattern that may
// compile to more than celMaxRegexProgram instructions, when evaluated
// over the largest inputs.
func checkBounds(env *cel.Env, a *cel.Ast) error {
	w := &worstCase{}
	if _, err := env.EstimateCost(a, w, w.options()...); err != nil {
		return fmt.Errorf("estimating its cost: %w", err)
	}
	if w.largest > celMaxValueBytes {
		return fmt.Errorf("%s may build a value of %s (over an answer of %d bytes), more than the limit of %d bytes",
			w.largestCall, bytesOf(w.largest), MaxResultBytes, celMaxValueBytes)
	}
	if w.program > celMaxRegexProgram {
		return fmt.Errorf("matches a regular expression that may compile to %d instructions, more than the limit of %d",
			w.program, celMaxRegexProgram)
	}
	if w.pattern > celMaxRegexProgram/regexInstPerByte {
		return fmt.Errorf("matches a pattern computed when evaluated, of %s: such a pattern may be at most %d bytes long "+
			"(a byte may compile to %d instructions, and the limit is %d; a literal pattern is measured instead)",
			bytesOf(w.pattern), celMaxRegexProgram/regexInstPerByte, regexInstPerByte, celMaxRegexProgram)
	}
	return nil
}

// bytesOf says how many bytes n is at most, or that it has no bound.
func bytesOf(n uint64) string {
	if n == math.MaxUint64 {
		return "unbounded size"
	}
	return fmt.Sprintf("up to %d bytes", n)
}
