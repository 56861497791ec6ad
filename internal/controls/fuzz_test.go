package controls_test

import (
	"context"
	"runtime"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/controls/controlstest"
)

// FuzzCompileExpr compiles any failure_when/accept_when a client may send:
// compiling never panics, an expression over CELMaxLength never compiles,
// and one that compiles evaluates (within the cost and memory limits) and
// checks without a panic, over a result made from the input too.
func FuzzCompileExpr(f *testing.F) {
	for _, src := range []string{
		`result.text != "x"`, `result.text ==`, `answer == ""`, `result.txt == ""`, `attempt + 1`, `attempt == "1"`,
		`result.text.contains("no results")`, `size(result.data.items) < 3`, `result.data.ok`,
		`attempt > 2 && delegate == "search"`, `result.text.lowerAscii().startsWith("error")`, `!has(result.data)`,
		`size(result.text) > 3`, `[1,2,3].map(x, x * 2).size() == 3`, `result.text.split(" ").exists(w, w == "no")`,
		`result.data.items.all(i, i.score > 0.5)`, `dyn(result.data.n) + 1 > 2`, `result.text.matches("^[a-z]+$")`,
		`[1,2].map(x, [1,2].map(y, [1,2].map(z, x*y*z))).size() > 0`, `"x".repeat(1000).size() > 3`,
		// Memory: refused (issue 17's amplification, a long join separator,
		// a computed pattern), and the builders the bounds let through.
		`result.text.replace("", result.text + result.text).size() < 0`, `result.text.split("").join(result.text) != ""`,
		`result.text.matches(result.text)`, `result.text.replace("a", "0123456").size() > 1`,
		`"%s: %s".format([delegate, result.text]).size() > 1`, `dyn([1, 2]).join(",") == ""`,
	} {
		f.Add(src, `{"items": [{"score": 0.7}], "ok": true, "n": 1}`, "some text")
	}
	f.Fuzz(func(t *testing.T, src, data, text string) {
		for _, field := range []string{"failure_when", "accept_when"} {
			e, err := controls.CompileExpr(field, src)
			if len([]rune(src)) > controls.CELMaxLength && err == nil {
				t.Fatalf("an expression of %d characters compiled", len(src))
			}
			if err != nil {
				continue
			}
			r := &stubbornv1.Result{Text: text}
			if v := (&structpb.Value{}); v.UnmarshalJSON([]byte(data)) == nil {
				r.Data = v
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, _ = e.Eval(ctx, 2, "search", r)
			_, _ = e.Check(ctx, 2, "search", r)
			_, _ = e.Eval(ctx, 1, "", nil)
			if ctx.Err() != nil {
				t.Fatalf("evaluating %q took more than 10s", src)
			}
			cancel()
		}
	})
}

// FuzzJournalReplay decodes a journal as a store would hand it to a server
// taking a run over (each event a protobuf RunEvent, here each the bytes
// of a field 1 of the input) and replays it as runs.Manager.resume does:
// the state of its run_started event, NewReplayTracker, Execute. Nothing in
// a journal, however broken, may panic or hang the replay. Delegates answer
// from the second input; a budget of events and calls ends runaway runs, and
// every decision asked for is answered.
func FuzzJournalReplay(f *testing.F) {
	specs := []*stubbornv1.ControlSpec{
		{Kind: &stubbornv1.ControlSpec_Retry{Retry: &stubbornv1.RetrySpec{Target: "d", Attempts: ptr(int32(2)), BaseWait: durationpb.New(time.Second)}}},
		{Kind: &stubbornv1.ControlSpec_Retry{Retry: &stubbornv1.RetrySpec{Target: "d", Attempts: ptr(int32(1)), OnExhausted: stubbornv1.OnExhausted_ON_EXHAUSTED_FAIL}}},
		{Kind: &stubbornv1.ControlSpec_RetryWithLearning{RetryWithLearning: &stubbornv1.RetryWithLearningSpec{Target: "d", MaxRetries: ptr(int32(3)), FailureWhen: `result.text == "bad"`}}},
		{Kind: &stubbornv1.ControlSpec_FallbackChain{FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"a", "b", "c"}}}},
		{Kind: &stubbornv1.ControlSpec_Race{Race: &stubbornv1.RaceSpec{Candidates: []string{"a", "b"}, AcceptWhen: `result.text != "bad"`}}},
		{Kind: &stubbornv1.ControlSpec_Race{Race: &stubbornv1.RaceSpec{Candidates: []string{"a", "b", "c"}, HedgeDelay: durationpb.New(time.Second)}}},
		{Kind: &stubbornv1.ControlSpec_Balance{Balance: &stubbornv1.BalanceSpec{
			Targets: []*stubbornv1.BalanceTarget{{Name: "a", Weight: ptr(int32(3))}, {Name: "b"}, {Name: "c"}}, MaxAttempts: ptr(int32(2)),
		}}},
	}
	for _, spec := range specs {
		for _, answers := range [][]byte{{1, 1, 0}, {2, 0}, {1, 1, 1, 1, 1, 0}} {
			st := &stubbornv1.ControlState{RunId: "run_seed", TaskBrief: "task", Control: spec, Tenant: "a"}
			all, err := replayJournal(context.Background(), st, nil, answers)
			if err != nil {
				f.Fatal(err)
			}
			for _, cut := range []int{len(all), len(all) / 2, 2, 1} {
				if cut > 0 && cut <= len(all) {
					f.Add(encodeJournal(all[:cut]), answers)
				}
			}
		}
	}
	f.Fuzz(func(t *testing.T, data, answers []byte) {
		journal, ok := decodeJournal(data)
		if !ok || len(journal) == 0 {
			return
		}
		st := proto.CloneOf(journal[0].GetRunStarted().GetState())
		if st == nil {
			return // the manager refuses a journal that does not start with run_started
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := replayJournal(ctx, st, journal, answers); err != nil {
			t.Fatal(err)
		}
	})
}

// encodeJournal writes events as repeated bytes fields 1.
func encodeJournal(evs []*stubbornv1.RunEvent) []byte {
	var b []byte
	for _, ev := range evs {
		m, err := proto.Marshal(ev)
		if err != nil {
			panic(err)
		}
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendBytes(b, m)
	}
	return b
}

// decodeJournal reads what encodeJournal writes: at most 300 events, each
// decoded with proto.Unmarshal like the stores do. ok is false for input
// that is not such a list.
func decodeJournal(b []byte) ([]*stubbornv1.RunEvent, bool) {
	var evs []*stubbornv1.RunEvent
	for len(b) > 0 && len(evs) < 300 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || num != 1 || typ != protowire.BytesType {
			return nil, false
		}
		b = b[n:]
		v, m := protowire.ConsumeBytes(b)
		if m < 0 {
			return nil, false
		}
		b = b[m:]
		ev := &stubbornv1.RunEvent{}
		if err := proto.Unmarshal(v, ev); err != nil {
			return nil, false
		}
		evs = append(evs, ev)
	}
	return evs, true
}

// answerer answers each call by its number: answers[i] % 4 is 0 success,
// 1 UNAVAILABLE (transient), 2 INVALID_ARGUMENT, 3 the text "bad".
type answerer struct {
	answers []byte
	mu      sync.Mutex
	calls   int
	over    func()
}

func (a *answerer) Call(ctx context.Context, c controls.Call) (*stubbornv1.Result, error) {
	a.mu.Lock()
	a.calls++
	n := a.calls
	a.mu.Unlock()
	if n > 300 {
		a.over()
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var b byte
	if len(a.answers) > 0 {
		b = a.answers[(n-1)%len(a.answers)]
	}
	switch b % 4 {
	case 1:
		return nil, &controls.CallError{Code: codes.Unavailable, Message: "busy"}
	case 2:
		return nil, &controls.CallError{Code: codes.InvalidArgument, Message: "no"}
	case 3:
		return &stubbornv1.Result{Text: "bad"}, nil
	}
	return &stubbornv1.Result{Text: "ok: " + c.Brief[:min(len(c.Brief), 10)]}, nil
}
func (a *answerer) Info(string) controls.DelegateInfo    { return controls.DelegateInfo{Idempotent: true} }
func (a *answerer) Serving(context.Context, string) bool { return true }

// replayJournal runs st's control with a tracker that replays journal, and
// returns the journal with the new events. It ends the run once it has
// 300 events or calls, answers each decision it waits for (from answers),
// and fails if the run outlives ctx.
func replayJournal(ctx context.Context, st *stubbornv1.ControlState, journal []*stubbornv1.RunEvent, answers []byte) ([]*stubbornv1.RunEvent, error) {
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var mu sync.Mutex
	all := append([]*stubbornv1.RunEvent(nil), journal...)
	rec := func(ev *stubbornv1.RunEvent, _ *stubbornv1.ControlState) {
		mu.Lock()
		defer mu.Unlock()
		ev = proto.CloneOf(ev) // ev is only the tracker's during the call
		ev.Seq = int64(len(all)) + 1
		all = append(all, ev)
		if len(all) > 300 {
			stop()
		}
	}
	clock := controlstest.NewClock()
	tr := controls.NewReplayTracker(st, clock, rec, journal)
	done := make(chan struct{})
	var decider sync.WaitGroup
	decider.Add(1)
	go func() {
		defer decider.Done()
		for i := 0; ; {
			select {
			case <-done:
				return
			default:
			}
			d := stubbornv1.Decision_DECISION_FAIL
			if len(answers) > 0 && answers[i%len(answers)]&4 != 0 {
				d = stubbornv1.Decision_DECISION_RETRY
			}
			if tr.Decide(d, nil) == nil {
				i++
			}
			runtime.Gosched()
		}
	}()
	tr.Start()
	env := &controls.Env{Delegates: &answerer{answers: answers, over: stop}, Tracker: tr, Clock: clock}
	// As runs.Manager does: criteria from the spec (nil without any).
	env.Criteria = controls.NewCriteria(st.GetControl(), "", env.Delegates)
	out := controls.Execute(runCtx, env, st.GetTaskBrief(), st.GetControl())
	close(done)
	decider.Wait()
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	tr.Finish(out.Status, out.Result, out.Winner, out.Reason, out.Code)
	mu.Lock()
	defer mu.Unlock()
	return all, nil
}
