package server

import (
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/delegates"
)

// violated returns the fields a status names in its google.rpc.BadRequest,
// failing unless it is INVALID_ARGUMENT with one.
func violated(t *testing.T, err error) []string {
	t.Helper()
	st := status.Convert(err)
	require.Equal(t, codes.InvalidArgument, st.Code(), st.Message())
	var fields []string
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			for _, v := range br.GetFieldViolations() {
				fields = append(fields, v.GetField())
			}
		}
	}
	require.NotEmpty(t, fields, "INVALID_ARGUMENT carries a google.rpc.BadRequest")
	return fields
}

// TestEveryInputIsBoundedAtSubmission checks each bound of a run request
// at its limit (accepted, or NOT_FOUND for a well-formed name that is not
// in the registry) and just over it (INVALID_ARGUMENT naming the field and
// never repeating the value).
func TestEveryInputIsBoundedAtSubmission(t *testing.T) {
	t.Parallel()
	val := &validator{limits: defaultLimits(), known: func(n string) bool { return n == "echo" }, hasJudge: true}
	name := func(n int) string { return strings.Repeat("d", n) }
	echo := func(r *stubbornv1.StartRunRequest) *stubbornv1.StartRunRequest {
		r.TaskBrief = "x"
		if r.GetRetry() == nil && r.GetRetryWithLearning() == nil && r.GetRace() == nil && r.GetFallbackChain() == nil {
			r.FallbackChain = &stubbornv1.FallbackChainSpec{Chain: []string{"echo"}}
		}
		return r
	}
	withOptions := func(o *stubbornv1.RunOptions) *stubbornv1.StartRunRequest {
		return echo(&stubbornv1.StartRunRequest{Options: o})
	}
	msg := func(role, content string) *structpb.Struct {
		return &structpb.Struct{Fields: map[string]*structpb.Value{"role": structpb.NewStringValue(role), "content": structpb.NewStringValue(content)}}
	}
	withMessages := func(m ...*structpb.Struct) *stubbornv1.StartRunRequest {
		return &stubbornv1.StartRunRequest{TaskMessages: m, FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"echo"}}}
	}
	withBrief := func(r *stubbornv1.StartRunRequest) *stubbornv1.StartRunRequest {
		r.TaskBrief = "x" // its own brief: only the messages' size is over
		return r
	}
	manyMessages := func(n int) []*structpb.Struct {
		out := make([]*structpb.Struct, n)
		for i := range out {
			out[i] = msg("user", "x")
		}
		return out
	}
	metadata := func(n int, key func(i int) string, value string) map[string]string {
		md := make(map[string]string, n)
		for i := range n {
			md[key(i)] = value
		}
		return md
	}
	keyOf := func(size int) func(int) string {
		return func(i int) string { return fmt.Sprintf("%0*d", size, i) }
	}
	// A valid expression of exactly n characters.
	celOf := func(n int) string {
		const pre, post = `result.text == "`, `"`
		return pre + strings.Repeat("é", n-len(pre)-len(post)) + post
	}
	tests := []struct {
		name string
		req  *stubbornv1.StartRunRequest
		code codes.Code // OK: accepted
		// field is the one violation's field for INVALID_ARGUMENT, and a
		// substring of the message otherwise.
		field string
		msg   string // a substring of the message
	}{
		// Delegate names, in every field that takes one.
		{"retry.target at 128 bytes", echo(&stubbornv1.StartRunRequest{Retry: &stubbornv1.RetrySpec{Target: name(128)}}), codes.NotFound, "retry.target", "is not in the registry"},
		{"retry.target over 128 bytes", echo(&stubbornv1.StartRunRequest{Retry: &stubbornv1.RetrySpec{Target: name(129)}}), codes.InvalidArgument, "retry.target", "is 129 bytes, more than the limit of 128"},
		{"retry.target with a space", echo(&stubbornv1.StartRunRequest{Retry: &stubbornv1.RetrySpec{Target: "ec ho"}}), codes.InvalidArgument, "retry.target", "no whitespace"},
		{"retry_with_learning.target over", echo(&stubbornv1.StartRunRequest{RetryWithLearning: &stubbornv1.RetryWithLearningSpec{Target: name(129)}}), codes.InvalidArgument, "retry_with_learning.target", "more than the limit of 128"},
		{"retry_with_learning.analyst at 128 bytes", echo(&stubbornv1.StartRunRequest{RetryWithLearning: &stubbornv1.RetryWithLearningSpec{Target: "echo", Analyst: name(128)}}), codes.NotFound, "retry_with_learning.analyst", "is not in the registry"},
		{"retry_with_learning.analyst over", echo(&stubbornv1.StartRunRequest{RetryWithLearning: &stubbornv1.RetryWithLearningSpec{Target: "echo", Analyst: name(129)}}), codes.InvalidArgument, "retry_with_learning.analyst", "more than the limit of 128"},
		{"retry_with_learning.analyst with a control character", echo(&stubbornv1.StartRunRequest{RetryWithLearning: &stubbornv1.RetryWithLearningSpec{Target: "echo", Analyst: "a\x1bb"}}), codes.InvalidArgument, "retry_with_learning.analyst", "control"},
		{"fallback_chain.chain[1] at 128 bytes", echo(&stubbornv1.StartRunRequest{FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"echo", name(128)}}}), codes.NotFound, "fallback_chain.chain[1]", "is not in the registry"},
		{"fallback_chain.chain[1] over", echo(&stubbornv1.StartRunRequest{FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"echo", name(129)}}}), codes.InvalidArgument, "fallback_chain.chain[1]", "more than the limit of 128"},
		{"race.candidates[0] at 128 bytes", echo(&stubbornv1.StartRunRequest{Race: &stubbornv1.RaceSpec{Candidates: []string{name(128)}}}), codes.NotFound, "race.candidates[0]", "is not in the registry"},
		{"race.candidates[0] over", echo(&stubbornv1.StartRunRequest{Race: &stubbornv1.RaceSpec{Candidates: []string{name(129), "echo"}}}), codes.InvalidArgument, "race.candidates[0]", "more than the limit of 128"},
		{"race.candidates[1] with a newline", echo(&stubbornv1.StartRunRequest{Race: &stubbornv1.RaceSpec{Candidates: []string{"echo", "echo\n"}}}), codes.InvalidArgument, "race.candidates[1]", "no whitespace"},
		{"options.judge at 128 bytes", withOptions(&stubbornv1.RunOptions{Judge: name(128)}), codes.NotFound, "options.judge", "is not in the registry"},
		{"options.judge over", withOptions(&stubbornv1.RunOptions{Judge: name(129)}), codes.InvalidArgument, "options.judge", "more than the limit of 128"},

		// Conversations: roles, content shapes, count and size.
		{"task_messages alone", withMessages(msg("user", "hi")), codes.OK, "", ""},
		{"task_messages with a bad role", withMessages(msg("root", "hi")), codes.InvalidArgument, "task_messages[0].role", `"root" is not a role`},
		{"task_messages with numeric content", withMessages(&structpb.Struct{Fields: map[string]*structpb.Value{"role": structpb.NewStringValue("user"), "content": structpb.NewNumberValue(1)}}, msg("user", "hi")), codes.InvalidArgument, "task_messages[0].content", "must be a string"},
		{"task_messages without text", withMessages(msg("user", "")), codes.InvalidArgument, "task_messages", "have no text"},
		{"task_messages over 1000", withMessages(manyMessages(1001)...), codes.InvalidArgument, "task_messages", "has 1001 messages, more than the limit of 1000"},
		{"task_messages over 4 briefs", withBrief(withMessages(msg("user", strings.Repeat("a", 60<<10)), msg("assistant", strings.Repeat("b", 60<<10)), msg("user", strings.Repeat("c", 60<<10)), msg("user", strings.Repeat("d", 60<<10)), msg("user", strings.Repeat("e", 60<<10)))), codes.InvalidArgument, "task_messages", "more than the limit of 262144"},

		// Stall timeouts: 0 to 24 h.
		{"options.first_output_timeout at 24h", withOptions(&stubbornv1.RunOptions{FirstOutputTimeout: durationpb.New(24 * time.Hour)}), codes.OK, "", ""},
		{"options.first_output_timeout over 24h", withOptions(&stubbornv1.RunOptions{FirstOutputTimeout: durationpb.New(24*time.Hour + 1)}), codes.InvalidArgument, "options.first_output_timeout", "must be a duration between 0 and 24h0m0s"},
		{"options.idle_timeout negative", withOptions(&stubbornv1.RunOptions{IdleTimeout: durationpb.New(-time.Second)}), codes.InvalidArgument, "options.idle_timeout", "must be a duration between 0 and 24h0m0s"},

		// The brief and the criteria, bounded by max_brief_bytes.
		{"task_brief at the limit", &stubbornv1.StartRunRequest{TaskBrief: name(64 << 10), FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"echo"}}}, codes.OK, "", ""},
		{"task_brief over the limit", &stubbornv1.StartRunRequest{TaskBrief: name(64<<10 + 1), FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"echo"}}}, codes.InvalidArgument, "task_brief", "is 65537 bytes, more than the limit of 65536"},
		{"failure_criteria at the limit", echo(&stubbornv1.StartRunRequest{FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"echo"}, FailureCriteria: name(64 << 10)}}), codes.OK, "", ""},
		{"failure_criteria over the limit", echo(&stubbornv1.StartRunRequest{FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"echo"}, FailureCriteria: name(64<<10 + 1)}}), codes.InvalidArgument, "fallback_chain.failure_criteria", "more than the limit of 65536"},

		// CEL: characters, not bytes.
		{"failure_when at 4096 characters", echo(&stubbornv1.StartRunRequest{FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"echo"}, FailureWhen: celOf(controls.CELMaxLength)}}), codes.OK, "", ""},
		{"failure_when over 4096 characters", echo(&stubbornv1.StartRunRequest{FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"echo"}, FailureWhen: celOf(controls.CELMaxLength + 1)}}), codes.InvalidArgument, "fallback_chain.failure_when", "is 4097 characters, more than the limit of 4096"},
		{"accept_when over 4096 characters", echo(&stubbornv1.StartRunRequest{Race: &stubbornv1.RaceSpec{Candidates: []string{"echo"}, AcceptWhen: celOf(controls.CELMaxLength + 1)}}), codes.InvalidArgument, "race.accept_when", "is 4097 characters"},

		// options.idempotency_key: printable ASCII, 256 bytes.
		{"idempotency_key at 256 bytes", withOptions(&stubbornv1.RunOptions{IdempotencyKey: strings.Repeat("k ~", 85) + "k"}), codes.OK, "", ""},
		{"idempotency_key over 256 bytes", withOptions(&stubbornv1.RunOptions{IdempotencyKey: name(257)}), codes.InvalidArgument, "options.idempotency_key", "is 257 bytes, more than the limit of 256"},
		{"idempotency_key with a newline", withOptions(&stubbornv1.RunOptions{IdempotencyKey: "a\nb"}), codes.InvalidArgument, "options.idempotency_key", "printable ASCII"},
		{"idempotency_key with a DEL", withOptions(&stubbornv1.RunOptions{IdempotencyKey: "a\x7f"}), codes.InvalidArgument, "options.idempotency_key", "printable ASCII"},
		{"idempotency_key not ASCII", withOptions(&stubbornv1.RunOptions{IdempotencyKey: "clé"}), codes.InvalidArgument, "options.idempotency_key", "printable ASCII"},

		// options.metadata: 64 entries, keys and values 1 KiB, 64 KiB in all.
		{"metadata at 64 entries", withOptions(&stubbornv1.RunOptions{Metadata: metadata(64, keyOf(2), "v")}), codes.OK, "", ""},
		{"metadata over 64 entries", withOptions(&stubbornv1.RunOptions{Metadata: metadata(65, keyOf(2), "v")}), codes.InvalidArgument, "options.metadata", "has 65 entries, more than the limit of 64"},
		{"metadata key at 1 KiB", withOptions(&stubbornv1.RunOptions{Metadata: metadata(1, keyOf(1024), "v")}), codes.OK, "", ""},
		{"metadata key over 1 KiB", withOptions(&stubbornv1.RunOptions{Metadata: metadata(1, keyOf(1025), "v")}), codes.InvalidArgument, "options.metadata", "is 1025 bytes, more than the limit of 1024"},
		{"metadata key with a control character", withOptions(&stubbornv1.RunOptions{Metadata: map[string]string{"a\x00b": "v"}}), codes.InvalidArgument, "options.metadata", `key "a\x00b" has a control character`},
		{"metadata key with a C1 control character", withOptions(&stubbornv1.RunOptions{Metadata: map[string]string{"a\u0085": "v"}}), codes.InvalidArgument, "options.metadata", "has a control character"},
		{"metadata key empty", withOptions(&stubbornv1.RunOptions{Metadata: map[string]string{"": "v"}}), codes.InvalidArgument, "options.metadata", "a key is empty"},
		{"metadata value at 1 KiB", withOptions(&stubbornv1.RunOptions{Metadata: map[string]string{"k": name(1024)}}), codes.OK, "", ""},
		{"metadata value over 1 KiB", withOptions(&stubbornv1.RunOptions{Metadata: map[string]string{"k": name(1025)}}), codes.InvalidArgument, "options.metadata", `the value of key "k" is 1025 bytes, more than the limit of 1024`},
		{"metadata at 64 KiB in all", withOptions(&stubbornv1.RunOptions{Metadata: metadata(32, keyOf(1024), name(1024))}), codes.OK, "", ""},
		{"metadata over 64 KiB in all", withOptions(&stubbornv1.RunOptions{Metadata: func() map[string]string {
			md := metadata(32, keyOf(1024), name(1024))
			md["k"] = ""
			return md
		}()}), codes.InvalidArgument, "options.metadata", "is 65537 bytes (keys and values), more than the limit of 65536"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := val.runSpec(tt.req)
			if tt.code == codes.OK {
				require.NoError(t, err)
				return
			}
			st := status.Convert(err)
			require.Equal(t, tt.code, st.Code(), st.Message())
			assert.Contains(t, st.Message(), tt.msg)
			assert.Contains(t, st.Message(), tt.field+": ")
			if tt.code == codes.InvalidArgument {
				assert.Equal(t, []string{tt.field}, violated(t, err))
			}
			assert.Less(t, len(st.Message()), 512, "the message repeats no long value")
			assert.NotContains(t, st.Message(), name(129), "the message repeats no long value")
		})
	}
}

// TestRaceHedgeDelayIsBoundedByMaxWait: race.hedge_delay is a valid
// duration from 0 to the max_wait limit (the server's, or a tenant's
// tighter one); unset and 0 mean no hedging.
func TestRaceHedgeDelayIsBoundedByMaxWait(t *testing.T) {
	t.Parallel()
	known := func(n string) bool { return n == "a" || n == "b" }
	tests := []struct {
		name    string
		maxWait time.Duration // 0: the default, 1h
		delay   *durationpb.Duration
		msg     string // a substring of the message; empty: accepted
	}{
		{"unset", 0, nil, ""},
		{"0: no hedging", 0, durationpb.New(0), ""},
		{"1ms", 0, durationpb.New(time.Millisecond), ""},
		{"at the default limit", 0, durationpb.New(time.Hour), ""},
		{"over the default limit", 0, durationpb.New(time.Hour + time.Nanosecond), "race.hedge_delay: must be at most 1h0m0s, got 1h0m0.000000001s"},
		{"at a configured limit", time.Minute, durationpb.New(time.Minute), ""},
		{"over a configured limit", time.Minute, durationpb.New(time.Minute + time.Millisecond), "race.hedge_delay: must be at most 1m0s, got 1m0.001s"},
		{"negative", 0, durationpb.New(-time.Millisecond), "race.hedge_delay: must not be negative, got -1ms"},
		{"not a valid duration", 0, &durationpb.Duration{Seconds: 1, Nanos: -1}, "race.hedge_delay: is not a valid duration"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			val := &validator{limits: limits{MaxWait: tt.maxWait}.withDefaults(), known: known}
			req := &stubbornv1.StartRunRequest{TaskBrief: "x", Race: &stubbornv1.RaceSpec{Candidates: []string{"a", "b"}, HedgeDelay: tt.delay}}
			spec, err := val.runSpec(req)
			if tt.msg == "" {
				require.NoError(t, err)
				assert.True(t, proto.Equal(tt.delay, spec.GetRace().GetHedgeDelay()), "the delay reaches the control as sent")
				return
			}
			assert.Equal(t, []string{"race.hedge_delay"}, violated(t, err))
			assert.Contains(t, status.Convert(err).Message(), tt.msg)
		})
	}
}

// TestAHedgedRaceMayNamePresets: a hedged race whose candidates include
// a preset is accepted (issue 31: effects are keyed by path, so the
// preset's nested attempts replay apart from the candidates started after
// it; it was refused before).
func TestAHedgedRaceMayNamePresets(t *testing.T) {
	t.Parallel()
	val := &validator{limits: defaultLimits(), known: func(string) bool { return true }, isDelegate: func(n string) bool { return n != "p" }}
	race := func(d time.Duration, candidates ...string) *stubbornv1.StartRunRequest {
		return &stubbornv1.StartRunRequest{TaskBrief: "x", Race: &stubbornv1.RaceSpec{Candidates: candidates, HedgeDelay: durationpb.New(d)}}
	}
	for _, ok := range []*stubbornv1.StartRunRequest{race(time.Second, "a", "p"), race(time.Second, "p", "p"), race(0, "a", "p"), race(time.Second, "a", "b")} {
		spec, err := val.runSpec(ok)
		require.NoError(t, err, "%v", ok)
		assert.Equal(t, ok.GetRace().GetCandidates(), spec.GetRace().GetCandidates())
	}
}

// TestRunIDAndPageTokenBounds checks run_id and page_token at and over
// their limits, and their alphabet (a run id becomes part of a NATS
// subject: no '.', '*', '>' or space).
func TestRunIDAndPageTokenBounds(t *testing.T) {
	t.Parallel()
	check := func(f func(*violations)) error {
		var v violations
		f(&v)
		return v.err()
	}
	for _, id := range []string{"run_0123456789abcdefghijklmnopq", "r", "A-z_9", strings.Repeat("a", 64)} {
		assert.NoError(t, runID(id), "%q", id)
		assert.True(t, validRunID(id))
	}
	for id, want := range map[string]string{
		"":                      "run_id: must not be empty",
		strings.Repeat("a", 65): "run_id: is 65 bytes, more than the limit of 64",
		"run.a":                 "run_id: may hold only ASCII letters, digits, '_' and '-'",
		"run_*":                 "may hold only",
		">":                     "may hold only",
		"run a":                 "may hold only",
		"run_\x00":              "may hold only",
		"runé":                  "may hold only",
	} {
		err := runID(id)
		assert.Equal(t, []string{"run_id"}, violated(t, err), "%q", id)
		assert.Contains(t, status.Convert(err).Message(), want)
		assert.False(t, validRunID(id))
	}
	assert.NoError(t, check(func(v *violations) { checkPageToken(v, "") }))
	assert.NoError(t, check(func(v *violations) { checkPageToken(v, strings.Repeat("A", 256)) }))
	for tok, want := range map[string]string{
		strings.Repeat("A", 257): "page_token: is 257 bytes, more than the limit of 256",
		"abc=":                   "page_token: is not valid",
		"a.b":                    "page_token: is not valid",
	} {
		err := check(func(v *violations) { checkPageToken(v, tok) })
		assert.Equal(t, []string{"page_token"}, violated(t, err))
		assert.Contains(t, status.Convert(err).Message(), want)
	}
}

// TestManyWrongEntriesMakeOneViolation: a request with many wrong entries
// of one kind is told about the first, and how many more there are, not
// with one violation each; a chain longer than its limit is refused as a
// whole, its names past the limit not looked at.
func TestManyWrongEntriesMakeOneViolation(t *testing.T) {
	t.Parallel()
	val := &validator{limits: defaultLimits(), known: func(string) bool { return true }}
	md := map[string]string{}
	for i := range 40 {
		md[fmt.Sprintf("k%02d\n", i)] = strings.Repeat("v", 1025)
	}
	_, err := val.runSpec(&stubbornv1.StartRunRequest{TaskBrief: "x", FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"echo"}}, Options: &stubbornv1.RunOptions{Metadata: md}})
	assert.Equal(t, []string{"options.metadata", "options.metadata"}, violated(t, err))
	msg := status.Convert(err).Message()
	assert.Contains(t, msg, `key "k00\n" has a control character or is not valid UTF-8 (and 39 more entries like it)`)
	assert.Contains(t, msg, `the value of key "k00\n" is 1025 bytes, more than the limit of 1024 (and 39 more entries like it)`)

	chain := make([]string, 1000)
	for i := range chain {
		chain[i] = strings.Repeat("x", delegates.MaxNameBytes+1)
	}
	_, err = val.runSpec(&stubbornv1.StartRunRequest{TaskBrief: "x", FallbackChain: &stubbornv1.FallbackChainSpec{Chain: chain}})
	fields := violated(t, err)
	// The count, then the first max_chain names: 33 violations, of which
	// the first 10 are named and the rest counted (violations.err).
	assert.Len(t, fields, 10+1)
	assert.Equal(t, "fallback_chain.chain", fields[0])
	assert.Equal(t, "fallback_chain.chain[8]", fields[9])
	assert.Contains(t, status.Convert(err).Message(), "; …and 23 more violations")
}

// TestViolationsAreBounded: the status of many violations names the first
// maxListedViolations of them, each cut to its bounds on a character
// boundary, within maxViolationsMessageBytes, then counts the rest, in the
// message and in the BadRequest detail alike; a few violations are named
// as they are. (A chain of 60 empty names made a status that C-core
// clients refused: over 8 KiB of trailers.)
func TestViolationsAreBounded(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("é", 400) // 800 bytes, two per character
	tests := []struct {
		name     string
		n        int
		desc     string
		listed   int    // violations named one by one
		count    string // the last entry, or "" when every violation is named
		maxBytes int
	}{
		{"one", 1, "is wrong", 1, "", 100},
		{"ten", 10, "is wrong", 10, "", 1024},
		{"eleven", 11, "is wrong", 10, "…and 1 more violation", 1024},
		{"sixty", 60, "must name a delegate", 10, "…and 50 more violations", 1024},
		{"sixty long ones", 60, long, 3, "…and 57 more violations", 1024},
		{"one long one", 1, long, 1, "", 512},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var v violations
			for i := range tt.n {
				v.add(fmt.Sprintf("fallback_chain.chain[%d]", i), "%s", tt.desc)
			}
			err := v.err()
			st := status.Convert(err)
			require.Equal(t, codes.InvalidArgument, st.Code())
			msg := st.Message()
			assert.LessOrEqual(t, len(msg), tt.maxBytes)
			assert.True(t, utf8.ValidString(msg), "cut on a character boundary")
			var br *errdetails.BadRequest
			for _, d := range st.Details() {
				if b, ok := d.(*errdetails.BadRequest); ok {
					br = b
				}
			}
			require.NotNil(t, br)
			entries := br.GetFieldViolations()
			want := tt.listed
			if tt.count != "" {
				want++
			}
			require.Len(t, entries, want, msg)
			parts := strings.Split(msg, "; ")
			require.Len(t, parts, want, msg)
			for i, e := range entries[:tt.listed] {
				assert.Equal(t, fmt.Sprintf("fallback_chain.chain[%d]", i), e.GetField())
				assert.LessOrEqual(t, len(e.GetDescription()), maxViolationDescriptionBytes)
				assert.True(t, utf8.ValidString(e.GetDescription()))
				assert.True(t, strings.HasPrefix(tt.desc, strings.TrimSuffix(e.GetDescription(), "…")), "a prefix of the description")
				assert.Equal(t, e.GetField()+": "+e.GetDescription(), parts[i])
			}
			if tt.count != "" {
				last := entries[len(entries)-1]
				assert.Empty(t, last.GetField())
				assert.Equal(t, tt.count, last.GetDescription())
				assert.Equal(t, tt.count, parts[len(parts)-1])
			}
		})
	}
	var none violations
	assert.NoError(t, none.err())
}

// TestCELErrorsAreBounded: an expression with hundreds of errors, each of
// which CEL reports with the whole source line, is refused with its first
// error and a count, not with every error.
func TestCELErrorsAreBounded(t *testing.T) {
	t.Parallel()
	val := &validator{limits: defaultLimits(), known: func(string) bool { return true }}
	expr := strings.Repeat("result.nope || ", 270) + "true"
	require.LessOrEqual(t, len(expr), controls.CELMaxLength)
	_, err := val.runSpec(&stubbornv1.StartRunRequest{TaskBrief: "x", FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"echo"}, FailureWhen: expr}})
	assert.Equal(t, []string{"fallback_chain.failure_when"}, violated(t, err))
	msg := status.Convert(err).Message()
	assert.Contains(t, msg, "fallback_chain.failure_when: is not a valid CEL expression: ERROR: <input>:1:")
	assert.Contains(t, msg, "undefined field 'nope'")
	assert.Contains(t, msg, "(and 269 more errors)")
	assert.Less(t, len(msg), 1024)

	// One error on a line of 4,000 characters: its first line only.
	long := `result.text == "` + strings.Repeat("x", 3900) + `" && nope`
	_, err = val.runSpec(&stubbornv1.StartRunRequest{TaskBrief: "x", FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"echo"}, FailureWhen: long}})
	msg = status.Convert(err).Message()
	assert.Contains(t, msg, "undeclared reference to 'nope'")
	assert.NotContains(t, msg, strings.Repeat("x", 100))

	assert.Equal(t, "abc", truncate("abc", 3))
	assert.Equal(t, "a…", truncate("abcdef", 4))
	assert.Equal(t, "…", truncate("éé", 3), "never half a character")
}

// TestATypedConversationIsCheckedAgainstEveryDelegateItReaches: a
// RunRequest's conversation is refused with task_messages or model_params,
// over its bounds, and for each field a delegate the control reaches
// (targets, chain members, candidates, through presets; not judges or
// analysts) cannot carry, naming the field and the delegate, unless the
// conversation allows dropping it. A legacy request (task_messages,
// model_params) is checked as the typed conversation it reads as, its
// fields named as it has them.
func TestATypedConversationIsCheckedAgainstEveryDelegateItReaches(t *testing.T) {
	t.Parallel()
	kinds := map[string]string{"gpt": delegates.KindOpenAI, "claude": delegates.KindAnthropic, "svc": delegates.KindGRPC, "hook": delegates.KindHTTP}
	chain := func(names ...string) *stubbornv1.ControlSpec {
		return &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_FallbackChain{FallbackChain: &stubbornv1.FallbackChainSpec{Chain: names}}}
	}
	presets := map[string]*stubbornv1.ControlSpec{
		"mixed": chain("gpt", "claude"),
		"outer": {Kind: &stubbornv1.ControlSpec_Race{Race: &stubbornv1.RaceSpec{Candidates: []string{"svc", "mixed"}}}},
	}
	val := &validator{limits: defaultLimits(), hasJudge: true,
		known:    func(n string) bool { return kinds[n] != "" || presets[n] != nil },
		kindOf:   func(n string) string { return kinds[n] },
		presetOf: func(n string) (*stubbornv1.ControlSpec, bool) { p, ok := presets[n]; return p, ok },
	}
	user := func(text string) *stubbornv1.ChatMessage {
		return &stubbornv1.ChatMessage{Role: stubbornv1.ChatRole_CHAT_ROLE_USER, Content: []*stubbornv1.ContentPart{{Kind: &stubbornv1.ContentPart_Text{Text: text}}}}
	}
	conv := func(o *stubbornv1.ModelOptions, msgs ...*stubbornv1.ChatMessage) *stubbornv1.Conversation {
		if len(msgs) == 0 {
			msgs = []*stubbornv1.ChatMessage{user("hi")}
		}
		return &stubbornv1.Conversation{Api: stubbornv1.ConversationAPI_CONVERSATION_API_CHAT_COMPLETIONS, Messages: msgs, Options: o}
	}
	nTwo := func() *stubbornv1.Conversation { return conv(&stubbornv1.ModelOptions{N: proto.Int32(2)}) }
	retry := func(target string, c *stubbornv1.Conversation) *stubbornv1.RunRequest {
		return &stubbornv1.RunRequest{Conversation: c, Retry: &stubbornv1.RetrySpec{Target: target}}
	}
	dropped := func(c *stubbornv1.Conversation, paths ...string) *stubbornv1.Conversation {
		c.DropParams, c.DropAllParams = paths, len(paths) == 0
		return c
	}
	// A legacy request: its Structs read as the typed conversation, the
	// fields named as the request has them.
	legacy := func(target string, params map[string]any, msgs ...map[string]any) *stubbornv1.RunRequest {
		if len(msgs) == 0 {
			msgs = []map[string]any{{"role": "user", "content": "hi"}}
		}
		req := &stubbornv1.RunRequest{Retry: &stubbornv1.RetrySpec{Target: target}}
		for _, m := range msgs {
			s, err := structpb.NewStruct(m)
			require.NoError(t, err)
			req.TaskMessages = append(req.TaskMessages, s)
		}
		if params != nil {
			var err error
			req.ModelParams, err = structpb.NewStruct(params)
			require.NoError(t, err)
		}
		return req
	}
	// A chat history of 100 KB (over max_brief_bytes, within the
	// conversation's bound of 4 times that).
	long := func() *stubbornv1.Conversation {
		var msgs []*stubbornv1.ChatMessage
		for range 10 {
			msgs = append(msgs, user(strings.Repeat("y", 10000)), &stubbornv1.ChatMessage{Role: stubbornv1.ChatRole_CHAT_ROLE_ASSISTANT, Content: []*stubbornv1.ContentPart{{Kind: &stubbornv1.ContentPart_Text{Text: "ok"}}}})
		}
		return conv(nil, append(msgs, user("and the last question"))...)
	}
	many := make([]*stubbornv1.ChatMessage, 1001)
	for i := range many {
		many[i] = user("x")
	}
	tools := make([]*stubbornv1.Tool, 129)
	for i := range tools {
		tools[i] = &stubbornv1.Tool{Name: fmt.Sprint("t", i)}
	}
	for _, tc := range []struct {
		name  string
		req   *stubbornv1.RunRequest
		field string // "": accepted
		msg   string
	}{
		{"alone, to openai", retry("gpt", nTwo()), "", ""},
		{"with task_messages", &stubbornv1.RunRequest{Conversation: conv(nil), TaskMessages: []*structpb.Struct{{}}, Retry: &stubbornv1.RetrySpec{Target: "gpt"}}, "conversation", "is set with task_messages"},
		{"with model_params", &stubbornv1.RunRequest{Conversation: conv(nil), ModelParams: &structpb.Struct{}, Retry: &stubbornv1.RetrySpec{Target: "gpt"}}, "conversation", "is set with model_params"},
		{"n to anthropic", retry("claude", nTwo()), "conversation.options.n", `delegate "claude" (anthropic) cannot carry n`},
		{"n to anthropic through a preset", retry("mixed", nTwo()), "conversation.options.n", `delegate "claude" (anthropic) cannot carry n`},
		{"n to anthropic through nested presets", retry("outer", nTwo()), "conversation.options.n", `delegate "claude" (anthropic)`},
		{"n to a chain member", &stubbornv1.RunRequest{Conversation: nTwo(), FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"gpt", "claude"}}}, "conversation.options.n", `delegate "claude"`},
		{"n to a race candidate", &stubbornv1.RunRequest{Conversation: nTwo(), Race: &stubbornv1.RaceSpec{Candidates: []string{"claude"}}}, "conversation.options.n", `delegate "claude"`},
		{"n to a learning target", &stubbornv1.RunRequest{Conversation: nTwo(), RetryWithLearning: &stubbornv1.RetryWithLearningSpec{Target: "claude"}}, "conversation.options.n", `delegate "claude"`},
		{"a judge is not reached", &stubbornv1.RunRequest{Conversation: nTwo(), Retry: &stubbornv1.RetrySpec{Target: "gpt"}, Options: &stubbornv1.RunOptions{Judge: "claude"}}, "", ""},
		{"an analyst is not reached", &stubbornv1.RunRequest{Conversation: nTwo(), RetryWithLearning: &stubbornv1.RetryWithLearningSpec{Target: "gpt", Analyst: "claude"}}, "", ""},
		{"grpc carries everything", retry("svc", conv(&stubbornv1.ModelOptions{N: proto.Int32(2), TopK: proto.Int64(3)})), "", ""},
		{"http takes the brief", retry("hook", conv(&stubbornv1.ModelOptions{N: proto.Int32(2), TopK: proto.Int64(3)})), "", ""},
		{"top_k to openai", retry("gpt", conv(&stubbornv1.ModelOptions{TopK: proto.Int64(3)})), "conversation.options.top_k", `delegate "gpt" (openai) cannot carry top_k`},
		{"response_format to anthropic", retry("claude", conv(&stubbornv1.ModelOptions{ResponseFormat: &stubbornv1.ResponseFormat{Type: stubbornv1.ResponseFormatType_RESPONSE_FORMAT_TYPE_JSON_OBJECT}})), "conversation.options.response_format", "forced tool"},
		{"n dropped by path", retry("claude", dropped(nTwo(), "n")), "", ""},
		{"n dropped with all", retry("claude", dropped(nTwo())), "", ""},
		{"another path dropped", retry("claude", dropped(nTwo(), "seed")), "conversation.options.n", `delegate "claude"`},
		{"no messages", retry("gpt", &stubbornv1.Conversation{}), "conversation.messages", "at least one message"},
		{"over the message count", retry("gpt", conv(nil, many...)), "conversation.messages", "more than the limit of 1000"},
		{"over the tool count", retry("gpt", conv(&stubbornv1.ModelOptions{Tools: tools})), "conversation.options.tools", "more than the limit of 128"},
		{"n over its bound", retry("gpt", conv(&stubbornv1.ModelOptions{N: proto.Int32(129)})), "conversation.options.n", "between 1 and 128"},
		{"no role", retry("gpt", conv(nil, &stubbornv1.ChatMessage{Content: []*stubbornv1.ContentPart{{Kind: &stubbornv1.ContentPart_Text{Text: "x"}}}})), "conversation.messages[0].role", "must be one of"},
		{"legacy n to anthropic", legacy("claude", map[string]any{"n": 2}), "model_params.n", `delegate "claude" (anthropic) cannot carry n`},
		{"legacy n to anthropic through a preset", legacy("mixed", map[string]any{"n": 2}), "model_params.n", `delegate "claude" (anthropic) cannot carry n`},
		{"legacy n to openai", legacy("gpt", map[string]any{"n": 2}), "", ""},
		{"legacy n to grpc", legacy("svc", map[string]any{"n": 2, "top_k": 3}), "", ""},
		{"legacy n over its bound", legacy("gpt", map[string]any{"n": 129}), "model_params.n", "must be 1 to 128"},
		{"legacy tool without a name", legacy("gpt", map[string]any{"tools": []any{map[string]any{"type": "function", "function": map[string]any{"name": ""}}}}), "model_params.tools[0].function.name", "is required"},
		{"legacy message name to anthropic", legacy("claude", nil, map[string]any{"role": "user", "content": "hi", "name": "bob"}), "task_messages[0].name", `delegate "claude" (anthropic) cannot carry`},
		{"legacy extra parameter to anthropic", legacy("claude", map[string]any{"foo": "bar"}), "model_params.foo", `delegate "claude" (anthropic) cannot carry foo`},
		{"legacy role", legacy("gpt", nil, map[string]any{"role": "root", "content": "hi"}), "task_messages[0].role", `"root" is not a role`},
		{"a tool name over 64 bytes", retry("gpt", conv(&stubbornv1.ModelOptions{Tools: []*stubbornv1.Tool{{Name: strings.Repeat("n", 65)}}})), "conversation.options.tools[0].name", "65 bytes, more than the limit of 64"},
		{"a 100,000-byte tool name", retry("gpt", conv(&stubbornv1.ModelOptions{Tools: []*stubbornv1.Tool{{Name: strings.Repeat("n", 100000)}}})), "conversation.options.tools[0].name", "more than the limit of 64"},
		{"a tool name with a space", retry("claude", conv(&stubbornv1.ModelOptions{Tools: []*stubbornv1.Tool{{Name: "get weather"}}})), "conversation.options.tools[0].name", "letters, digits, _ and -"},
		{"a tool named in tool_choice", retry("gpt", conv(&stubbornv1.ModelOptions{ToolChoice: &stubbornv1.ToolChoice{Name: "a.b"}})), "conversation.options.tool_choice.name", "has '.' at byte 1"},
		{"a call's name", retry("gpt", conv(nil, user("hi"), &stubbornv1.ChatMessage{Role: stubbornv1.ChatRole_CHAT_ROLE_ASSISTANT, ToolCalls: []*stubbornv1.ToolCall{{Id: "c1", Name: strings.Repeat("n", 70)}}})), "conversation.messages[1].tool_calls[0].name", "more than the limit of 64"},
		{"a call's id", retry("gpt", conv(nil, user("hi"), &stubbornv1.ChatMessage{Role: stubbornv1.ChatRole_CHAT_ROLE_ASSISTANT, ToolCalls: []*stubbornv1.ToolCall{{Id: strings.Repeat("i", 257), Name: "f"}}})), "conversation.messages[1].tool_calls[0].id", "more than the limit of 256"},
		{"a tool result's id", retry("gpt", conv(nil, user("hi"), &stubbornv1.ChatMessage{Role: stubbornv1.ChatRole_CHAT_ROLE_TOOL, ToolCallId: strings.Repeat("i", 257)})), "conversation.messages[1].tool_call_id", "more than the limit of 256"},
		{"legacy tool name over 64 bytes", legacy("gpt", map[string]any{"tools": []any{map[string]any{"type": "function", "function": map[string]any{"name": strings.Repeat("n", 65)}}}}), "model_params.tools[0].name", "more than the limit of 64"},
		{"a 64-byte tool name", retry("claude", conv(&stubbornv1.ModelOptions{Tools: []*stubbornv1.Tool{{Name: strings.Repeat("n", 64)}}})), "", ""},
		{"a long history to openai", retry("gpt", long()), "", ""},
		{"a long history to grpc", retry("svc", long()), "", ""},
		{"a long history to http", retry("hook", long()), "conversation", `delegate "hook" (http) gets the conversation as its brief, which would be cut`},
		{"a long history to http with a brief", &stubbornv1.RunRequest{TaskBrief: "Summarise.", Conversation: long(), Retry: &stubbornv1.RetrySpec{Target: "hook"}}, "", ""},
		{"a long legacy history to http", legacy("hook", nil, map[string]any{"role": "user", "content": strings.Repeat("x", 70000)}), "task_messages", `delegate "hook" (http)`},
		{"a long legacy history to openai", legacy("gpt", nil, map[string]any{"role": "user", "content": strings.Repeat("x", 70000)}), "", ""},
		{"over its size", retry("gpt", conv(nil, user(strings.Repeat("x", 4*defaultLimits().MaxBriefBytes+1)))), "conversation", "more than the limit of"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := val.runSpec(tc.req)
			if tc.field == "" {
				require.NoError(t, err)
				return
			}
			assert.Contains(t, violated(t, err), tc.field)
			assert.Contains(t, status.Convert(err).Message(), tc.msg)
		})
	}
}

// TestATypedConversationsBriefShowsItsToolCalls: the brief of a run asked
// as a typed conversation (what a judge or an http delegate reads) shows
// the assistant's tool calls and the tools' answers.
func TestATypedConversationsBriefShowsItsToolCalls(t *testing.T) {
	t.Parallel()
	text := func(s string) []*stubbornv1.ContentPart {
		return []*stubbornv1.ContentPart{{Kind: &stubbornv1.ContentPart_Text{Text: s}}}
	}
	c := &stubbornv1.Conversation{Messages: []*stubbornv1.ChatMessage{
		{Role: stubbornv1.ChatRole_CHAT_ROLE_USER, Content: text("Weather in Paris?")},
		{Role: stubbornv1.ChatRole_CHAT_ROLE_ASSISTANT, ToolCalls: []*stubbornv1.ToolCall{{Id: "call_1", Name: "get_weather", Arguments: `{"city":"Paris"}`}}},
		{Role: stubbornv1.ChatRole_CHAT_ROLE_TOOL, ToolCallId: "call_1", Content: text("18°C"), IsError: true},
	}}
	assert.Equal(t, "user: Weather in Paris?\n\nassistant: \n→ get_weather#call_1({\"city\":\"Paris\"})\n\ntool#call_1 (error): 18°C", typedBrief(c))
	task := taskOf(&stubbornv1.RunRequest{Conversation: c}, defaultLimits().MaxBriefBytes)
	assert.Same(t, c, task.Conversation)
	assert.Equal(t, typedBrief(c), task.Brief)
	// A brief over the bound keeps the conversation's end, whole
	// characters, and says what it left out.
	long := &stubbornv1.Conversation{Messages: []*stubbornv1.ChatMessage{
		{Role: stubbornv1.ChatRole_CHAT_ROLE_USER, Content: text(strings.Repeat("é", 60000))},
		{Role: stubbornv1.ChatRole_CHAT_ROLE_USER, Content: text("the last question")},
	}}
	brief := taskOf(&stubbornv1.RunRequest{Conversation: long}, 1000).Brief
	assert.LessOrEqual(t, len(brief), 1000)
	assert.True(t, utf8.ValidString(brief))
	assert.True(t, strings.HasSuffix(brief, "user: the last question"), brief)
	assert.Regexp(t, `^\[the conversation's first \d+ bytes are left out of this brief\]\n\n`, brief)
	assert.Equal(t, "Hi", typedBrief(&stubbornv1.Conversation{Messages: []*stubbornv1.ChatMessage{{Role: stubbornv1.ChatRole_CHAT_ROLE_USER, Content: text("Hi")}}}))
}
