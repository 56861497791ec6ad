package server

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/delegates"
)

// FuzzValidateRunRequest checks any StartRunRequest a client may send (the
// protobuf bytes of it), as a tenant allowed every delegate and as one
// allowed only "a", with small limits: never a panic; a refusal is
// INVALID_ARGUMENT or NOT_FOUND; an accepted request selects exactly one
// control, is within the limits and names only delegates the tenant may
// use.
func FuzzValidateRunRequest(f *testing.F) {
	u32 := func(v int32) *int32 { return &v }
	seeds := []*stubbornv1.StartRunRequest{
		{TaskBrief: "find it", Retry: &stubbornv1.RetrySpec{Target: "a", Attempts: u32(3), MaxWait: durationpb.New(time.Second)}},
		{TaskBrief: "find it", RetryWithLearning: &stubbornv1.RetryWithLearningSpec{Target: "a", MaxRetries: u32(2), FailureWhen: `result.text == ""`, Analyst: "judge"}},
		{TaskBrief: "find it", FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"a", "b", "p"}, FailureCriteria: "empty"}},
		{TaskBrief: "find it", Race: &stubbornv1.RaceSpec{Candidates: []string{"a", "b"}, AcceptWhen: `size(result.text) > 3`}},
		{TaskBrief: "find it", Race: &stubbornv1.RaceSpec{Candidates: []string{"a", "b"}, HedgeDelay: durationpb.New(50 * time.Millisecond)}},
		{TaskBrief: "find it", Race: &stubbornv1.RaceSpec{Candidates: []string{"a", "p"}, HedgeDelay: durationpb.New(50 * time.Millisecond)}},
		{TaskBrief: "x", Retry: &stubbornv1.RetrySpec{Target: "zzz"}, Options: &stubbornv1.RunOptions{Judge: "p", Metadata: map[string]string{"k": "v"}, RunTimeout: durationpb.New(-time.Second)}},
		{TaskBrief: "x", Retry: &stubbornv1.RetrySpec{Target: "a"}, Options: &stubbornv1.RunOptions{IdempotencyKey: "k\x01", Metadata: map[string]string{"k\n": "v", "": ""}}},
		{TaskBrief: " ", Retry: &stubbornv1.RetrySpec{Target: "a"}, Race: &stubbornv1.RaceSpec{}},
		{TaskBrief: strings.Repeat("b", 300), FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"a", "", "a", "a", "a", "a"}, FailureWhen: "result.text +"}},
	}
	for _, s := range seeds {
		b, err := proto.Marshal(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	known := map[string]bool{"a": true, "b": true, "judge": true, "p": true}
	o := options{
		Known:      func(n string) bool { return known[n] },
		IsDelegate: func(n string) bool { return known[n] && n != "p" },
		HasJudge:   true,
	}
	server := &serverLevel{limits: limits{MaxBriefBytes: 256, MaxAttempts: 10, MaxChain: 4, MaxWait: time.Minute, MaxMetadata: 4}}
	policies := map[string]*policy{
		"all":    newPolicy("all", limits{}, nil, server, o),
		"only-a": newPolicy("only-a", limits{MaxChain: 2}, []string{"a"}, server, o),
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		req := &stubbornv1.StartRunRequest{}
		if proto.Unmarshal(b, req) != nil {
			return
		}
		for name, p := range policies {
			spec, err := p.val.runSpec(req)
			if err != nil {
				if c := status.Code(err); c != codes.InvalidArgument && c != codes.NotFound {
					t.Fatalf("%s: refused with %s: %v", name, c, err)
				}
				continue
			}
			if err := checkAccepted(req, spec, p); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
		}
	})
}

// checkAccepted returns what is wrong with a request p's validator
// accepted as spec, or nil: it must select exactly one control, be within
// the limits and name only delegates the tenant may use, by valid names.
func checkAccepted(req *stubbornv1.StartRunRequest, spec *stubbornv1.ControlSpec, p *policy) error {
	if spec.GetKind() == nil {
		return errors.New("accepted without a control")
	}
	n := 0
	for _, set := range []bool{req.GetRetry() != nil, req.GetRetryWithLearning() != nil, req.GetFallbackChain() != nil, req.GetRace() != nil} {
		if set {
			n++
		}
	}
	if n != 1 {
		return fmt.Errorf("accepted with %d controls", n)
	}
	if l := len(req.GetTaskBrief()); l > p.limits.MaxBriefBytes || strings.TrimSpace(req.GetTaskBrief()) == "" {
		return fmt.Errorf("accepted a brief of %d bytes", l)
	}
	if len(req.GetFallbackChain().GetChain()) > p.limits.MaxChain || len(req.GetRace().GetCandidates()) > p.limits.MaxChain {
		return fmt.Errorf("accepted a chain longer than %d", p.limits.MaxChain)
	}
	if d := req.GetRace().GetHedgeDelay(); d != nil && (d.CheckValid() != nil || d.AsDuration() < 0 || d.AsDuration() > p.limits.MaxWait) {
		return fmt.Errorf("accepted race.hedge_delay %v", d)
	}
	names := append(append([]string{req.GetRetry().GetTarget(), req.GetRetryWithLearning().GetTarget(),
		req.GetRetryWithLearning().GetAnalyst(), req.GetOptions().GetJudge()},
		req.GetFallbackChain().GetChain()...), req.GetRace().GetCandidates()...)
	for _, d := range names {
		if d == "" {
			continue
		}
		if !p.val.known(d) {
			return fmt.Errorf("accepted delegate %q", d)
		}
		if err := delegates.CheckName(d); err != nil {
			return fmt.Errorf("accepted delegate name %q: %v", d, err)
		}
	}
	return checkAcceptedOptions(req.GetOptions())
}

// checkAcceptedOptions returns what is wrong with accepted run options.
func checkAcceptedOptions(o *stubbornv1.RunOptions) error {
	if k := o.GetIdempotencyKey(); len(k) > maxIdempotencyKeyBytes || !printableASCII(k) {
		return fmt.Errorf("accepted idempotency_key %q", k)
	}
	total := 0
	for k, v := range o.GetMetadata() {
		total += len(k) + len(v)
		if k == "" || len(k) > maxMetadataKeyBytes || len(v) > maxMetadataValueBytes || !controlFree(k) {
			return fmt.Errorf("accepted metadata entry %q", k)
		}
	}
	if total > maxMetadataBytes {
		return fmt.Errorf("accepted %d bytes of metadata", total)
	}
	return nil
}
