package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// The fault-injection ("chaos") suite of issue 29: a real three-node NATS
// cluster, three Stubborn replicas each behind fault proxies of its own,
// a mixed workload, one kind of fault per subtest, then the invariants of
// issue 29 checked on every run once the fault is over and the runs have
// settled (chaosCheck).
//
// `go test` (and so `make test`) runs every scenario in a short form;
// STUBBORN_CHAOS=long (`make chaos`) runs more runs and several rounds of
// each fault with a longer lease. -short runs the replica SIGKILL only.

// chaosConfig sizes the suite.
type chaosConfig struct {
	lease    time.Duration
	runs     int // runs started before the fault
	during   int // runs started while the fault lasts
	rounds   int // faults per scenario
	slowBase time.Duration
	settle   time.Duration // bound on the wait for the runs to end after the last fault
	converge time.Duration // bound on the wait for the listing index to agree with the journals
}

func chaosSizes() chaosConfig {
	if os.Getenv("STUBBORN_CHAOS") == "long" {
		return chaosConfig{lease: 6 * time.Second, runs: 200, during: 60, rounds: 3, slowBase: 3 * time.Second, settle: 3 * time.Minute, converge: 30 * time.Second}
	}
	return chaosConfig{lease: 3 * time.Second, runs: 32, during: 8, rounds: 1, slowBase: 2 * time.Second, settle: 20 * time.Second, converge: 5 * time.Second}
}

// chaosKind is one kind of run of the workload.
type chaosKind struct {
	name string
	req  func(i int) *stubbornv1.StartRunRequest
	ask  bool // ends awaiting a decision, which the test gives
}

func i32(v int32) *int32 { return &v }

var chaosKinds = []chaosKind{
	{name: "retry-wait", req: func(int) *stubbornv1.StartRunRequest {
		return &stubbornv1.StartRunRequest{TaskBrief: "wait then succeed", Retry: &stubbornv1.RetrySpec{
			Target: "hinted", Attempts: i32(2), BaseWait: durationpb.New(100 * time.Millisecond), MaxWait: durationpb.New(5 * time.Second)}}
	}},
	{name: "retry-flaky", req: func(int) *stubbornv1.StartRunRequest {
		return &stubbornv1.StartRunRequest{TaskBrief: "flaky", Retry: &stubbornv1.RetrySpec{
			Target: "flaky", Attempts: i32(3), BaseWait: durationpb.New(200 * time.Millisecond), MaxWait: durationpb.New(time.Second)}}
	}},
	{name: "retry-with-learning", req: func(int) *stubbornv1.StartRunRequest {
		return &stubbornv1.StartRunRequest{TaskBrief: "learn", RetryWithLearning: &stubbornv1.RetryWithLearningSpec{Target: "flaky", MaxRetries: i32(3)}}
	}},
	{name: "fallback-chain", req: func(int) *stubbornv1.StartRunRequest {
		return &stubbornv1.StartRunRequest{TaskBrief: "chain", FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"down", "slow", "idem"}}}
	}},
	{name: "race", req: func(int) *stubbornv1.StartRunRequest {
		return &stubbornv1.StartRunRequest{TaskBrief: "race", Race: &stubbornv1.RaceSpec{Candidates: []string{"slow", "idem", "flaky"}}}
	}},
	{name: "hedged-race", req: func(int) *stubbornv1.StartRunRequest {
		return &stubbornv1.StartRunRequest{TaskBrief: "hedged", Race: &stubbornv1.RaceSpec{Candidates: []string{"slow", "idem"}, HedgeDelay: durationpb.New(500 * time.Millisecond)}}
	}},
	{name: "not-idempotent", req: func(int) *stubbornv1.StartRunRequest {
		return &stubbornv1.StartRunRequest{TaskBrief: "once", Retry: &stubbornv1.RetrySpec{Target: "unsafe", Attempts: i32(1)}}
	}},
	{name: "ask", ask: true, req: func(int) *stubbornv1.StartRunRequest {
		return &stubbornv1.StartRunRequest{TaskBrief: "ask", Retry: &stubbornv1.RetrySpec{
			Target: "recovering", Attempts: i32(1), BaseWait: durationpb.New(50 * time.Millisecond), OnExhausted: stubbornv1.OnExhausted_ON_EXHAUSTED_ASK}}
	}},
}

// chaosRun is a run the workload started.
type chaosRun struct {
	id      string
	kind    chaosKind
	starter int // the replica StartRun answered through
	n       int
}

// decision is a DecideRun that answered OK.
type decision struct {
	run      string
	replica  int
	decision stubbornv1.Decision
	at       time.Time
	answered stubbornv1.RunStatus
}

// chaos is one scenario's world.
type chaos struct {
	t        *testing.T
	cfg      chaosConfig
	nats     *natsCluster
	replicas []*replica
	log      *callLog

	mu         sync.Mutex
	runs       []*chaosRun
	decisions  []decision
	decided    map[string]bool
	startErrs  []string // StartRun errors that were not UNAVAILABLE (issue 29 item 10)
	notes      []string // measurements, printed at the end
	violations map[string][]string
	general    []string
	// ended are the runs whose journal was seen to end (drivers): they
	// have no driver, and are not read again.
	ended map[string]bool
}

func (c *chaos) notef(format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	msg := fmt.Sprintf(format, args...)
	c.notes = append(c.notes, msg)
	c.t.Log(msg)
}

// violate records that run broke an invariant.
func (c *chaos) violate(run, invariant, format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.violations == nil {
		c.violations = map[string][]string{}
	}
	c.violations[run] = append(c.violations[run], invariant+": "+fmt.Sprintf(format, args...))
}

func (c *chaos) violateGeneral(invariant, format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.general = append(c.general, invariant+": "+fmt.Sprintf(format, args...))
}

func newChaos(t *testing.T, bin string, cfg chaosConfig) *chaos {
	c := &chaos{t: t, cfg: cfg, log: &callLog{}, decided: map[string]bool{}}
	c.nats = startChaosNATS(t, bin)
	configs := serveChaosDelegates(t, c.log, chaosDelegates(cfg.slowBase), 3)
	c.replicas = startReplicas(t, c.nats, configs, cfg.lease)
	require.NoError(t, c.nats.waitHealthy(context.Background(), 30*time.Second))
	return c
}

// startRuns starts n runs round-robin over the replicas, each with an
// idempotency key so that a StartRun whose answer was lost can be asked
// again. A StartRun that fails is tried again on the next replica, for up
// to bound.
func (c *chaos) startRuns(ctx context.Context, n int, bound time.Duration) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	c.mu.Lock()
	base := len(c.runs)
	c.mu.Unlock()
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			k := base + i
			kind := chaosKinds[k%len(chaosKinds)]
			req := kind.req(k)
			req.Options = &stubbornv1.RunOptions{IdempotencyKey: fmt.Sprintf("chaos-%s-%d", c.t.Name(), k)}
			deadline := time.Now().Add(bound)
			for try := 0; time.Now().Before(deadline); try++ {
				r := c.replicas[(k+try)%len(c.replicas)]
				cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				res, err := r.api().StartRun(cctx, req)
				cancel()
				if err == nil {
					c.mu.Lock()
					c.runs = append(c.runs, &chaosRun{id: res.GetRunId(), kind: kind, starter: r.idx, n: k})
					c.mu.Unlock()
					return
				}
				if code := status.Code(err); code != codes.Unavailable && code != codes.DeadlineExceeded {
					c.mu.Lock()
					c.startErrs = append(c.startErrs, fmt.Sprintf("StartRun #%d through %s: %v", k, r.name(), err))
					c.mu.Unlock()
				}
				time.Sleep(200 * time.Millisecond)
			}
			c.violateGeneral("every run started", "StartRun #%d (%s) never answered OK within %v", k, kind.name, bound)
		}()
	}
	wg.Wait()
}

func (c *chaos) allRuns() []*chaosRun {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.runs)
}

// drivers maps each run not finished to the replica that drives it: its
// owners entry's, else its journal's claim (the first message's
// Stubborn-Claim header: README "Runs and storage"), for the runs this
// test started.
func (c *chaos) drivers(ctx context.Context) (map[string]string, error) {
	owners, err := c.nats.owners(ctx)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.ended == nil {
		c.ended = map[string]bool{}
	}
	var look []string
	for _, r := range c.runs {
		if _, owned := owners[r.id]; !owned && !c.ended[r.id] {
			look = append(look, r.id)
		}
	}
	c.mu.Unlock()
	for _, id := range look {
		claimer, ended, err := c.nats.journalClaim(ctx, id)
		if err != nil {
			return nil, err
		}
		switch {
		case ended:
			c.mu.Lock()
			c.ended[id] = true
			c.mu.Unlock()
		case claimer != "":
			owners[id] = claimer
		}
	}
	// Owners entries written meanwhile (a takeover's) name the driver.
	if len(look) > 0 {
		now, err := c.nats.owners(ctx)
		if err != nil {
			return nil, err
		}
		maps.Copy(owners, now)
	}
	return owners, nil
}

// ownedBy counts the runs each replica drives (drivers).
func (c *chaos) ownedBy(ctx context.Context) map[int]int {
	owners, _ := c.drivers(ctx)
	out := map[int]int{}
	for _, o := range owners {
		for _, r := range c.replicas {
			r.mu.Lock()
			if r.owner == o {
				out[r.idx]++
			}
			r.mu.Unlock()
		}
	}
	return out
}

// busiest is the replica owning the most runs.
func (c *chaos) busiest(ctx context.Context) *replica {
	owned := c.ownedBy(ctx)
	best := c.replicas[0]
	for _, r := range c.replicas {
		if owned[r.idx] > owned[best.idx] {
			best = r
		}
	}
	c.notef("runs owned per replica: %v; busiest %s", owned, best.name())
	return best
}

// decide gives every run that awaits a decision its decision (RETRY for
// even runs, FAIL for odd ones), through the replica that started it
// first (after a fault, maybe one that lost the run) and then the others;
// every OK is recorded. It stops when every ask run is decided or at
// deadline.
func (c *chaos) decide(ctx context.Context, deadline time.Time) {
	for time.Now().Before(deadline) {
		pending := 0
		for _, run := range c.allRuns() {
			if !run.kind.ask {
				continue
			}
			c.mu.Lock()
			done := c.decided[run.id]
			c.mu.Unlock()
			if done {
				continue
			}
			pending++
			d := stubbornv1.Decision_DECISION_RETRY
			if run.n%2 == 1 {
				d = stubbornv1.Decision_DECISION_FAIL
			}
			for k := range c.replicas {
				r := c.replicas[(run.starter+k)%len(c.replicas)]
				cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
				got, err := r.api().GetRun(cctx, &stubbornv1.GetRunRequest{RunId: run.id})
				if err != nil || got.GetState().GetStatus() != stubbornv1.RunStatus_RUN_STATUS_AWAITING_DECISION {
					cancel()
					continue
				}
				res, err := r.api().DecideRun(cctx, &stubbornv1.DecideRunRequest{RunId: run.id, Decision: d})
				cancel()
				if err == nil {
					c.mu.Lock()
					c.decisions = append(c.decisions, decision{run: run.id, replica: r.idx, decision: d, at: time.Now(), answered: res.GetState().GetStatus()})
					c.decided[run.id] = true
					c.mu.Unlock()
					break
				}
			}
		}
		if pending == 0 {
			return
		}
		time.Sleep(300 * time.Millisecond)
	}
}

func terminal(s stubbornv1.RunStatus) bool {
	switch s {
	case stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, stubbornv1.RunStatus_RUN_STATUS_EXHAUSTED,
		stubbornv1.RunStatus_RUN_STATUS_FAILED, stubbornv1.RunStatus_RUN_STATUS_CANCELLED:
		return true
	}
	return false
}

// settle decides the runs awaiting a decision and waits, up to the
// bound, for every run to end (as the journal says: the last event is
// run_finished).
func (c *chaos) settle(ctx context.Context) {
	deadline := time.Now().Add(c.cfg.settle)
	start := time.Now()
	for time.Now().Before(deadline) {
		c.decide(ctx, time.Now().Add(2*time.Second))
		open := 0
		for _, run := range c.allRuns() {
			last, err := c.nats.lastEvent(ctx, run.id)
			if err != nil || last.GetRunFinished() == nil {
				open++
			}
		}
		if open == 0 {
			c.notef("every run ended %v after the fault", time.Since(start).Round(100*time.Millisecond))
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
	c.notef("settle: runs still open after %v", c.cfg.settle)
}

// watchJournal reads run's journal through r with WatchRun(after_seq=0)
// until it ends, for at most d.
func watchJournal(ctx context.Context, r *replica, run string, d time.Duration) ([]*stubbornv1.RunEvent, time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	start := time.Now()
	w, err := r.api().WatchRun(ctx, &stubbornv1.WatchRunRequest{RunId: run})
	if err != nil {
		return nil, 0, err
	}
	var evs []*stubbornv1.RunEvent
	for {
		m, err := w.Recv()
		if errors.Is(err, io.EOF) {
			return evs, time.Since(start), nil
		}
		if err != nil {
			return evs, time.Since(start), err
		}
		evs = append(evs, m.GetEvent())
	}
}

func eventKind(ev *stubbornv1.RunEvent) string {
	switch {
	case ev.GetRunStarted() != nil:
		return "run_started"
	case ev.GetAttemptStarted() != nil:
		a := ev.GetAttemptStarted().GetAttempt()
		return fmt.Sprintf("attempt_started(%d %s)", a.GetNumber(), a.GetDelegate())
	case ev.GetAttemptFinished() != nil:
		a := ev.GetAttemptFinished().GetAttempt()
		return fmt.Sprintf("attempt_finished(%d %s %s)", a.GetNumber(), a.GetDelegate(), strings.TrimPrefix(a.GetOutcome().String(), "ATTEMPT_OUTCOME_"))
	case ev.GetFailureAnalyzed() != nil:
		return "failure_analyzed"
	case ev.GetBackoffScheduled() != nil:
		return "backoff_scheduled(" + ev.GetBackoffScheduled().GetWait().AsDuration().String() + ")"
	case ev.GetDecisionRequested() != nil:
		return "decision_requested"
	case ev.GetDecisionReceived() != nil:
		return "decision_received(" + ev.GetDecisionReceived().GetDecision().String() + ")"
	case ev.GetRunResumed() != nil:
		return "run_resumed(" + ev.GetRunResumed().GetOwner() + ")"
	case ev.GetRunFinished() != nil:
		return "run_finished(" + ev.GetRunFinished().GetState().GetStatus().String() + ")"
	}
	return "?"
}

func seqs(evs []*stubbornv1.RunEvent) []int64 {
	out := make([]int64, len(evs))
	for i, ev := range evs {
		out[i] = ev.GetSeq()
	}
	return out
}

// dense says whether seqs are exactly 1..n.
func dense(s []int64) bool {
	for i, v := range s {
		if v != int64(i+1) {
			return false
		}
	}
	return true
}

// check verifies every invariant of issue 29 on every run, and fails the
// test with the offending runs' journals, states and calls.
func (c *chaos) check(ctx context.Context) {
	runs := c.allRuns()
	calls := c.log.all()
	callsOf := map[string][]call{}
	for _, cl := range calls {
		callsOf[cl.run] = append(callsOf[cl.run], cl)
	}
	known := map[string]bool{}
	for _, run := range runs {
		known[run.id] = true
	}
	for _, cl := range calls {
		if cl.run != "" && !known[cl.run] {
			c.violateGeneral("calls belong to started runs", "a call for run %s, which no StartRun returned: %s", cl.run, cl)
		}
	}
	c.mu.Lock()
	decisions := slices.Clone(c.decisions)
	c.mu.Unlock()
	decisionsOf := map[string][]decision{}
	for _, d := range decisions {
		decisionsOf[d.run] = append(decisionsOf[d.run], d)
	}

	finalStatus := map[string]stubbornv1.RunStatus{}
	var fmu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for _, run := range runs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			c.checkRun(ctx, run, callsOf[run.id], decisionsOf[run.id], func(st stubbornv1.RunStatus) {
				fmu.Lock()
				finalStatus[run.id] = st
				fmu.Unlock()
			})
		}()
	}
	wg.Wait()

	// The listing index converges to the journals (bounded wait).
	for _, r := range c.replicas {
		var wrong map[string]string
		deadline := time.Now().Add(c.cfg.converge)
		for {
			wrong = map[string]string{}
			listed := map[string]stubbornv1.RunStatus{}
			token := ""
			var err error
			for page := 0; page < 100; page++ {
				cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				var res *stubbornv1.ListRunsResponse
				res, err = r.api().ListRuns(cctx, &stubbornv1.ListRunsRequest{View: stubbornv1.RunView_RUN_VIEW_SUMMARY, PageSize: 1000, PageToken: token})
				cancel()
				if err != nil {
					break
				}
				for _, s := range res.GetSummaries() {
					listed[s.GetRunId()] = s.GetStatus()
				}
				if token = res.GetNextPageToken(); token == "" {
					break
				}
			}
			if err != nil {
				wrong["*"] = err.Error()
			}
			for id, st := range finalStatus {
				if got, ok := listed[id]; !ok {
					wrong[id] = "not listed"
				} else if got != st {
					wrong[id] = fmt.Sprintf("listed %s, journal ended %s", got, st)
				}
			}
			if len(wrong) == 0 || time.Now().After(deadline) {
				break
			}
			time.Sleep(500 * time.Millisecond)
		}
		for id, w := range wrong {
			c.violate(id, "ListRuns(RUN_VIEW_SUMMARY) agrees with the journal", "through %s (%v after the runs ended): %s", r.name(), c.cfg.converge, w)
		}
	}
	c.mu.Lock()
	for _, e := range c.startErrs {
		c.general = append(c.general, "a refused StartRun says UNAVAILABLE: "+e)
	}
	c.mu.Unlock()
	c.report(ctx, runs)
}

// checkRun checks one run's invariants (check).
func (c *chaos) checkRun(ctx context.Context, run *chaosRun, calls []call, decisions []decision, setFinal func(stubbornv1.RunStatus)) {
	id := run.id
	var final stubbornv1.RunStatus
	// The journal as stored, duplicates and all.
	raw, err := c.nats.rawJournal(ctx, id)
	if err != nil {
		c.violate(id, "journal readable", "reading the stream: %v", err)
	}
	var rawEvs []*stubbornv1.RunEvent
	for _, e := range raw {
		rawEvs = append(rawEvs, e.ev)
	}
	if !dense(seqs(rawEvs)) {
		c.violate(id, "stored journal dense (seq 1..n, no repeats, no gaps)", "seqs %v", seqs(rawEvs))
	}
	ended := len(rawEvs) > 0 && rawEvs[len(rawEvs)-1].GetRunFinished() != nil
	if !ended {
		last := "none"
		if len(rawEvs) > 0 {
			last = eventKind(rawEvs[len(rawEvs)-1])
		}
		c.violate(id, "every run ends", "the journal's last event is %s (%d events) %v after the fault", last, len(rawEvs), c.cfg.settle)
	} else {
		final = rawEvs[len(rawEvs)-1].GetRunFinished().GetState().GetStatus()
		setFinal(final)
	}

	// Through every replica: found, the same status, the same journal.
	var first []*stubbornv1.RunEvent
	for _, r := range c.replicas {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		got, err := r.api().GetRun(cctx, &stubbornv1.GetRunRequest{RunId: id})
		cancel()
		switch {
		case status.Code(err) == codes.NotFound:
			c.violate(id, "every run found", "GetRun through %s: %v", r.name(), err)
		case err != nil:
			c.violate(id, "GetRun answers", "through %s: %v", r.name(), err)
		case ended && got.GetState().GetStatus() != final:
			c.violate(id, "GetRun agrees with the journal on every replica", "through %s: %s, the journal ended %s", r.name(), got.GetState().GetStatus(), final)
		}
		if !ended {
			continue // WatchRun would follow it live
		}
		evs, took, err := watchJournal(ctx, r, id, 20*time.Second)
		if err != nil {
			c.violate(id, "WatchRun(after_seq=0) ends", "through %s after %v: %v (%d events)", r.name(), took.Round(time.Millisecond), err, len(evs))
		}
		if took > 5*time.Second {
			c.violate(id, "WatchRun of a finished run answers at once", "through %s it took %v", r.name(), took.Round(time.Millisecond))
		}
		if !dense(seqs(evs)) {
			c.violate(id, "WatchRun journal dense (seq 1..n, no repeats, no gaps)", "through %s: seqs %v", r.name(), seqs(evs))
		}
		if first == nil {
			first = evs
		} else if len(first) != len(evs) || !slices.EqualFunc(first, evs, func(a, b *stubbornv1.RunEvent) bool { return proto.Equal(a, b) }) {
			c.violate(id, "WatchRun journals identical across replicas", "%s: seqs %v; %s: seqs %v", c.replicas[0].name(), seqs(first), r.name(), seqs(evs))
		}
	}

	// Every call preceded by its attempt_started, stored before the
	// call was made; no (run, attempt) called twice; the delegate
	// that is not idempotent at most once a run.
	perAttempt := map[int32]int{}
	unsafe := 0
	for _, cl := range calls {
		perAttempt[cl.attempt]++
		if cl.delegate == "unsafe" {
			unsafe++
		}
		found := false
		for _, e := range raw {
			a := e.ev.GetAttemptStarted().GetAttempt()
			if a != nil && a.GetNumber() == cl.attempt && a.GetDelegate() == cl.delegate && !e.stored.After(cl.at) {
				found = true
				break
			}
		}
		if !found {
			c.violate(id, "every delegate call preceded by its attempt_started", "%s", cl)
		}
	}
	for a, n := range perAttempt {
		if n > 1 {
			c.violate(id, "no (run, attempt) called twice", "attempt %d called %d times", a, n)
		}
	}
	if unsafe > 1 {
		c.violate(id, "the non-idempotent delegate at most once a run", "called %d times", unsafe)
	}

	// Every DecideRun that answered OK is in the journal.
	for _, d := range decisions {
		found := false
		for _, ev := range rawEvs {
			if r := ev.GetDecisionReceived(); r != nil && r.GetDecision() == d.decision {
				found = true
			}
		}
		if !found {
			c.violate(id, "every DecideRun answered OK is in the journal", "DecideRun %s through r%d at %s answered OK (state %s), no decision_received", d.decision, d.replica, d.at.Format("15:04:05.000"), d.answered)
		}
	}
	if run.kind.ask && len(decisions) == 0 && ended && final != stubbornv1.RunStatus_RUN_STATUS_FAILED {
		c.violate(id, "a run awaiting a decision ends by it", "ended %s with no decision given", final)
	}
}

// report fails the test with every violation, and for the first runs
// that broke one: the journal as stored, GetRun through each replica, the
// delegate calls and the replicas' log lines.
func (c *chaos) report(ctx context.Context, runs []*chaosRun) {
	t := c.t
	c.mu.Lock()
	defer c.mu.Unlock()
	kindOf := map[string]*chaosRun{}
	for _, r := range runs {
		kindOf[r.id] = r
	}
	t.Logf("%d runs, %d delegate calls, %d decisions answered OK", len(runs), len(c.log.all()), len(c.decisions))
	for _, g := range c.general {
		t.Errorf("VIOLATION %s", g)
	}
	if len(c.violations) == 0 {
		return
	}
	byInvariant := map[string]int{}
	for _, vs := range c.violations {
		seen := map[string]bool{}
		for _, v := range vs {
			inv, _, _ := strings.Cut(v, ": ")
			if !seen[inv] {
				byInvariant[inv]++
				seen[inv] = true
			}
		}
	}
	var sum strings.Builder
	for _, inv := range sortedKeys(byInvariant) {
		fmt.Fprintf(&sum, "\n  %3d runs: %s", byInvariant[inv], inv)
	}
	t.Errorf("VIOLATIONS in %d of %d runs:%s", len(c.violations), len(runs), sum.String())
	ids := sortedKeys(c.violations)
	for n, id := range ids {
		var b strings.Builder
		run := kindOf[id]
		kind, starter := "?", -1
		if run != nil {
			kind, starter = run.kind.name, run.starter
		}
		fmt.Fprintf(&b, "run %s (%s, started through r%d):\n", id, kind, starter)
		for _, v := range c.violations[id] {
			fmt.Fprintf(&b, "  VIOLATION %s\n", v)
		}
		if n >= 8 {
			t.Log(b.String() + "  (details only for the first 8 runs)")
			continue
		}
		raw, err := c.nats.rawJournal(ctx, id)
		fmt.Fprintf(&b, "  journal as stored (err %v):\n", err)
		for _, e := range raw {
			fmt.Fprintf(&b, "    seq %-3d stream#%-6d stored %s  %s\n", e.ev.GetSeq(), e.streamSeq, e.stored.Format("15:04:05.000"), eventKind(e.ev))
		}
		for _, r := range c.replicas {
			cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			got, err := r.api().GetRun(cctx, &stubbornv1.GetRunRequest{RunId: id})
			cancel()
			if err != nil {
				fmt.Fprintf(&b, "  GetRun through %s (%s): %v\n", r.name(), r.owner, err)
				continue
			}
			var atts []string
			for _, a := range got.GetState().GetAttemptLog() {
				atts = append(atts, fmt.Sprintf("%d:%s:%s", a.GetNumber(), a.GetDelegate(), strings.TrimPrefix(a.GetOutcome().String(), "ATTEMPT_OUTCOME_")))
			}
			fmt.Fprintf(&b, "  GetRun through %s (%s): %s %q attempts %v\n", r.name(), r.owner, got.GetState().GetStatus(), got.GetState().GetStatusReason(), atts)
		}
		for _, cl := range c.log.forRun(id) {
			fmt.Fprintf(&b, "  call %s\n", cl)
		}
		for _, d := range c.decisions {
			if d.run == id {
				fmt.Fprintf(&b, "  DecideRun %s through r%d at %s: OK (%s)\n", d.decision, d.replica, d.at.Format("15:04:05.000"), d.answered)
			}
		}
		for _, r := range c.replicas {
			lines := r.logLinesFor(id)
			if len(lines) > 15 {
				lines = append(lines[:15], fmt.Sprintf("… %d more", len(lines)-15))
			}
			for _, l := range lines {
				fmt.Fprintf(&b, "  log %s: %s\n", r.name(), l)
			}
		}
		t.Log(b.String())
	}
}

// since prints a measured duration; -1 (not seen) as "never".
func since(d time.Duration) string {
	if d < 0 {
		return "never"
	}
	return d.Round(100 * time.Millisecond).String()
}

// healthOf asks r's health (the whole server), with a short timeout.
func healthOf(ctx context.Context, r *replica) (healthpb.HealthCheckResponse_ServingStatus, error) {
	cctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	res, err := r.healthClient().Check(cctx, &healthpb.HealthCheckRequest{})
	return res.GetStatus(), err
}

// waitNotServing polls r's health until NOT_SERVING (or an error), for at
// most d, and returns how long it took (or -1).
func waitNotServing(ctx context.Context, r *replica, d time.Duration) time.Duration {
	start := time.Now()
	for time.Since(start) < d {
		st, err := healthOf(ctx, r)
		if err == nil && st == healthpb.HealthCheckResponse_NOT_SERVING {
			return time.Since(start)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return -1
}

// chaosScenario is one kind of fault: inject injects it (round is
// 0, 1, …) and returns once it is over.
type chaosScenario struct {
	name   string
	inject func(ctx context.Context, c *chaos, round int)
}

var chaosScenarios = []chaosScenario{
	{"replica-sigkill", func(ctx context.Context, c *chaos, round int) {
		r := c.busiest(ctx)
		old := r.owner
		require.NoError(c.t, r.signal(syscall.SIGKILL))
		killed := time.Now()
		// Takeover: how long until the dead replica drives no run: no
		// owners entry names it, nor the journal of a run that has none.
		took := time.Duration(-1)
		var series []string // how many runs it still owned, each second
		for next := time.Duration(0); time.Since(killed) < 4*c.cfg.lease+10*time.Second; {
			owners, err := c.drivers(ctx)
			still := 0
			for _, o := range owners {
				if o == old {
					still++
				}
			}
			if at := time.Since(killed); err == nil && at >= next {
				series = append(series, fmt.Sprintf("%d@%.0fs", still, at.Seconds()))
				next += time.Second
			}
			if err == nil && still == 0 {
				took = time.Since(killed)
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		c.notef("round %d: SIGKILL %s (%s); its runs taken over after %v (lease %v); runs it still owned: %s",
			round, r.name(), old, since(took), c.cfg.lease, strings.Join(series, " "))
		if took < 0 || took > c.cfg.lease+2*time.Second {
			c.violateGeneral("takeover within lease + 2 s", "round %d: the runs of killed %s were still owned by it %v later (took %v)", round, r.name(), 4*c.cfg.lease+10*time.Second, took)
		}
		r.start(c.t, c.nats)
	}},
	{"replica-sigstop", func(ctx context.Context, c *chaos, round int) {
		r := c.busiest(ctx)
		require.NoError(c.t, r.signal(syscall.SIGSTOP))
		time.Sleep(2*c.cfg.lease + time.Second)
		require.NoError(c.t, r.signal(syscall.SIGCONT))
		c.notef("round %d: SIGSTOP %s for %v, then SIGCONT", round, r.name(), 2*c.cfg.lease+time.Second)
	}},
	{"nats-leader-sigkill", func(ctx context.Context, c *chaos, round int) {
		leader, err := c.nats.eventsLeader(ctx)
		require.NoError(c.t, err)
		n := c.nats.node(leader)
		n.kill(c.t)
		time.Sleep(c.cfg.lease)
		n.start(c.t)
		c.notef("round %d: SIGKILL NATS node %s (leader of STUBBORN_EVENTS) for %v, then restarted", round, leader, c.cfg.lease)
		require.NoError(c.t, c.nats.waitHealthy(ctx, time.Minute))
	}},
	{"nats-sigstop", func(ctx context.Context, c *chaos, round int) {
		use := nodeInUse(c.replicas, c.nats)
		best := c.nats.nodes[0].name
		for _, n := range c.nats.nodes {
			if use[n.name] > use[best] {
				best = n.name
			}
		}
		n := c.nats.node(best)
		var users []*replica
		for _, r := range c.replicas {
			for i, p := range r.proxies {
				if c.nats.nodes[i].name == best && p.active() > 0 {
					users = append(users, r)
				}
			}
		}
		require.NoError(c.t, n.signal(syscall.SIGSTOP))
		start := time.Now()
		// Health of the replicas connected to the stopped node (issue 29
		// item 6: SERVING while every store call fails).
		var hwg sync.WaitGroup
		for _, r := range users {
			hwg.Add(1)
			go func() {
				defer hwg.Done()
				took := waitNotServing(ctx, r, 2*c.cfg.lease)
				c.notef("round %d: %s (connected to stopped %s): health NOT_SERVING after %v (stopped for %v)", round, r.name(), best, since(took), 2*c.cfg.lease)
				if bound := c.cfg.lease + 2*time.Second; took < 0 || took > bound {
					c.violateGeneral("health NOT_SERVING within the lease (+2 s) of its NATS node stopped", "round %d: %s, connected to %s, went NOT_SERVING after %v (bound %v; the node was stopped for %v)", round, r.name(), best, since(took), bound, 2*c.cfg.lease)
				}
			}()
		}
		hwg.Wait()
		if rest := 2*c.cfg.lease - time.Since(start); rest > 0 {
			time.Sleep(rest)
		}
		require.NoError(c.t, n.signal(syscall.SIGCONT))
		c.notef("round %d: SIGSTOP NATS node %s (replicas using each node: %v) for %v, then SIGCONT", round, best, use, time.Since(start).Round(100*time.Millisecond))
		require.NoError(c.t, c.nats.waitHealthy(ctx, time.Minute))
	}},
	{"link-latency", func(ctx context.Context, c *chaos, round int) {
		r := c.busiest(ctx)
		for _, p := range r.proxies {
			p.setLatency(400 * time.Millisecond)
		}
		time.Sleep(2 * c.cfg.lease)
		for _, p := range r.proxies {
			p.setLatency(0)
		}
		c.notef("round %d: 400 ms on every chunk between %s and NATS for %v", round, r.name(), 2*c.cfg.lease)
	}},
	{"link-blackhole", func(ctx context.Context, c *chaos, round int) {
		r := c.busiest(ctx)
		for _, p := range r.proxies {
			p.setBlackhole(true)
		}
		start := time.Now()
		bound := c.cfg.lease + 2*time.Second
		took := waitNotServing(ctx, r, 2*c.cfg.lease+5*time.Second)
		if rest := 2*c.cfg.lease - time.Since(start); rest > 0 {
			time.Sleep(rest)
		}
		for _, p := range r.proxies {
			p.setBlackhole(false)
		}
		c.notef("round %d: blackhole between %s and NATS for %v; health NOT_SERVING after %v (bound: lease %v + 2 s)", round, r.name(), time.Since(start).Round(100*time.Millisecond), since(took), c.cfg.lease)
		if took < 0 || took > bound {
			c.violateGeneral("health NOT_SERVING within the lease (+2 s) of a blackholed link", "round %d: %s went NOT_SERVING after %v (bound %v; watched for %v)", round, r.name(), since(took), bound, 2*c.cfg.lease+5*time.Second)
		}
	}},
	{"link-resets", func(ctx context.Context, c *chaos, round int) {
		r := c.busiest(ctx)
		end := time.Now().Add(2 * c.cfg.lease)
		n := 0
		for time.Now().Before(end) {
			for _, p := range r.proxies {
				p.resetAll()
			}
			n++
			time.Sleep(time.Duration(200+rand.IntN(600)) * time.Millisecond)
		}
		c.notef("round %d: %d resets of every connection between %s and NATS over %v", round, n, r.name(), 2*c.cfg.lease)
	}},
}

// TestChaos runs each fault scenario (chaosScenarios) on a cluster of its
// own and checks issue 29's invariants on every run.
func TestChaos(t *testing.T) {
	cfg := chaosSizes()
	bin := buildNATSServer(t, t.TempDir())
	for _, sc := range chaosScenarios {
		t.Run(sc.name, func(t *testing.T) {
			if testing.Short() && sc.name != "replica-sigkill" {
				t.Skip("-short: only replica-sigkill")
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			began := time.Now()
			c := newChaos(t, bin, cfg)
			for round := range cfg.rounds {
				c.startRuns(ctx, cfg.runs, 30*time.Second)
				time.Sleep(1500 * time.Millisecond) // calls in flight, runs parked, some awaiting
				var wg sync.WaitGroup
				wg.Add(1)
				go func() { // runs started while the fault lasts
					defer wg.Done()
					time.Sleep(500 * time.Millisecond)
					c.startRuns(ctx, cfg.during, 30*time.Second)
				}()
				sc.inject(ctx, c, round)
				wg.Wait()
			}
			c.settle(ctx)
			c.check(ctx)
			t.Logf("scenario %s took %v", sc.name, time.Since(began).Round(time.Second))
		})
	}
	t.Run("concurrent-start", func(t *testing.T) {
		if testing.Short() {
			t.Skip("-short: only replica-sigkill")
		}
		chaosConcurrentStart(t, bin, cfg)
	})
}

// chaosConcurrentStart starts two replicas at the same moment on a fresh
// cluster (no stream, no bucket yet): both must serve (issue 29 item 7:
// concurrent creation of the streams and buckets must converge).
func chaosConcurrentStart(t *testing.T, bin string, cfg chaosConfig) {
	nc := startChaosNATS(t, bin)
	configs := serveChaosDelegates(t, &callLog{}, chaosDelegates(cfg.slowBase), 2)
	type result struct {
		idx  int
		addr string
		logs string
		err  error
	}
	results := make(chan result, 2)
	for i, config := range configs {
		port := freePorts(t, 1)[0]
		args := []string{"serve", "-log-format", "json", "-config", config, "-listen", fmt.Sprintf("127.0.0.1:%d", port), "-watch-config=false",
			"-nats-url", nc.nodes[i].url, "-replicas", "3", "-lease", cfg.lease.String()}
		cmd := exec.Command(os.Args[0], args...)
		cmd.Env = append(os.Environ(), childEnv+"=1")
		out, err := cmd.StderrPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		done := make(chan struct{})
		t.Cleanup(func() { _ = cmd.Process.Kill(); <-done; _ = cmd.Wait() })
		go func() {
			defer close(done)
			var logs strings.Builder
			sc := bufio.NewScanner(out)
			sent := false
			timer := time.AfterFunc(60*time.Second, func() { _ = cmd.Process.Kill() })
			defer timer.Stop()
			for sc.Scan() {
				line := sc.Text()
				logs.WriteString(line + "\n")
				if !sent && strings.Contains(line, `"msg":"stubborn serving"`) {
					_, rest, _ := strings.Cut(line, `"addr":"`)
					addr, _, _ := strings.Cut(rest, `"`)
					results <- result{idx: i, addr: addr}
					sent = true
					timer.Stop()
				}
			}
			if !sent {
				results <- result{idx: i, logs: logs.String(), err: errors.New("exited (or 60 s passed) before serving")}
			}
		}()
	}
	for range configs {
		r := <-results
		if r.err != nil {
			t.Errorf("VIOLATION replicas started at once on a fresh cluster both serve: r%d %v; its log:\n%s", r.idx, r.err, r.logs)
			continue
		}
		t.Logf("r%d serves on %s", r.idx, r.addr)
	}
}
