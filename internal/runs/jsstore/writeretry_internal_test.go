package jsstore

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls/controlstest"
	"github.com/stubbornhq/stubborn/internal/runs"
	"github.com/stubbornhq/stubborn/internal/runs/internal/runstest"
	"github.com/stubbornhq/stubborn/internal/runs/store"
)

// fault is what happens to one write made through a faulty connection.
type fault int

const (
	pass       fault = iota // made as asked
	unsent                  // never reaches NATS: its caller times out
	unanswered              // written, but its answer is lost: its caller times out
	refused                 // refused for good
	hangs                   // never answered: its caller waits for its context to end
)

// faults hands out the faults of successive writes, then passes; it counts
// the writes, and may run a hook at one of them.
type faults struct {
	mu     sync.Mutex
	plan   []fault
	always fault // after the plan
	calls  int
	at     int    // calls value at which hook runs
	hook   func() // or nil
	// deadlines are the deadlines of the writes' contexts (zero: none).
	deadlines []time.Time
}

// wait is a write that hangs: it waits for its context, at most a minute
// (a context without a deadline would get the client's timeout).
func (f *faults) wait(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return fmt.Errorf("nats: %w", ctx.Err())
	case <-time.After(time.Minute):
		return fmt.Errorf("nats: %w", context.DeadlineExceeded)
	}
}

func (f *faults) noteDeadline(ctx context.Context) {
	d, _ := ctx.Deadline()
	f.mu.Lock()
	f.deadlines = append(f.deadlines, d)
	f.mu.Unlock()
}

func (f *faults) next() fault {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.hook != nil && f.calls == f.at {
		f.hook()
	}
	if f.calls <= len(f.plan) {
		return f.plan[f.calls-1]
	}
	return f.always
}

func (f *faults) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

// apply makes a write through do as fault says; timeout is the error its
// caller gets when the answer does not come.
func apply[T any](ft fault, do func() (T, error)) (T, error) {
	var zero T
	switch ft {
	case unsent:
		return zero, fmt.Errorf("nats: %w", context.DeadlineExceeded)
	case unanswered:
		if _, err := do(); err != nil {
			return zero, err
		}
		return zero, nats.ErrTimeout
	case refused:
		return zero, nats.ErrMaxPayload
	}
	return do()
}

// faultyJS publishes the journal's messages through faults.
type faultyJS struct {
	jetstream.JetStream
	f *faults
}

func (j faultyJS) PublishMsg(ctx context.Context, msg *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	j.f.noteDeadline(ctx)
	ft := j.f.next()
	if ft == hangs {
		return nil, j.f.wait(ctx)
	}
	return apply(ft, func() (*jetstream.PubAck, error) { return j.JetStream.PublishMsg(ctx, msg, opts...) })
}

// faultyKV creates keys through faults.
type faultyKV struct {
	jetstream.KeyValue
	f *faults
}

func (k faultyKV) Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error) {
	return apply(k.f.next(), func() (uint64, error) { return k.KeyValue.Create(ctx, key, value, opts...) })
}

// openFaulty opens a JetStream store on a fresh embedded server whose
// journal publishes and owner-key creations go through faults.
func openFaulty(t *testing.T, retry time.Duration) (s *JetStream, pubs, creates *faults) {
	t.Helper()
	e, err := StartEmbedded(EmbeddedConfig{DataDir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(e.Close)
	nc, err := nats.Connect("", nats.InProcessServer(e.Server))
	require.NoError(t, err)
	s, err = NewJetStream(context.Background(), nc, JetStreamConfig{Memory: true, WriteRetry: retry, Lease: time.Hour})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	<-s.index.reconciled // it reads the fields swapped below
	pubs, creates = &faults{}, &faults{}
	s.js = faultyJS{s.js, pubs}
	s.owners = faultyKV{s.owners, creates}
	return s, pubs, creates
}

func testEvent(t *testing.T, runID string, seq int64, finished bool) store.Event {
	t.Helper()
	ev := &stubbornv1.RunEvent{RunId: runID, Seq: seq, Kind: &stubbornv1.RunEvent_AttemptStarted{AttemptStarted: &stubbornv1.AttemptStarted{}}}
	if finished {
		ev.Kind = &stubbornv1.RunEvent_RunFinished{RunFinished: &stubbornv1.RunFinished{}}
	}
	e, err := store.EncodeEvent(ev)
	require.NoError(t, err)
	return e
}

// journalSeqs reads the run's journal as stored: the seq of every event.
func journalSeqs(t *testing.T, s *JetStream, runID string) []int64 {
	t.Helper()
	evs, err := s.Events(context.Background(), runID, 0)
	require.NoError(t, err)
	seqs := make([]int64, 0, len(evs))
	for _, ev := range evs {
		seqs = append(seqs, ev.Seq)
	}
	return seqs
}

// TestAJournalWriteRidesOutAnOutage: a journal write that failed for a
// reason that may pass is made again; one that was written although its
// answer was lost is not written twice (the retry is refused: the journal
// moved on) but counts as made; one refused for good is not made again.
func TestAJournalWriteRidesOutAnOutage(t *testing.T) {
	ctx := context.Background()
	t.Run("unsent", func(t *testing.T) {
		s, pubs, _ := openFaulty(t, time.Minute)
		pubs.plan = []fault{unsent, unsent}
		require.NoError(t, s.Append(ctx, nil, testEvent(t, "run_a", 1, false), testEvent(t, "run_a", 2, false)))
		assert.Equal(t, 3, pubs.count(), "made a third time")
		require.NoError(t, s.Append(ctx, nil, testEvent(t, "run_a", 3, true)), "the store knows where the journal ends")
		assert.Equal(t, []int64{1, 2, 3}, journalSeqs(t, s, "run_a"))
	})
	t.Run("unanswered", func(t *testing.T) {
		s, pubs, _ := openFaulty(t, time.Minute)
		pubs.plan = []fault{pass, unanswered}
		require.NoError(t, s.Append(ctx, nil, testEvent(t, "run_b", 1, false)))
		require.NoError(t, s.Append(ctx, nil, testEvent(t, "run_b", 2, false)), "written, its answer lost: made")
		assert.Equal(t, 3, pubs.count(), "tried again once, which was refused")
		require.NoError(t, s.Append(ctx, nil, testEvent(t, "run_b", 3, true)), "the store knows where the journal ends")
		assert.Equal(t, []int64{1, 2, 3}, journalSeqs(t, s, "run_b"), "each event once")
	})
	t.Run("refused", func(t *testing.T) {
		s, pubs, _ := openFaulty(t, time.Minute)
		pubs.plan = []fault{refused}
		err := s.Append(ctx, nil, testEvent(t, "run_c", 1, false))
		require.ErrorIs(t, err, nats.ErrMaxPayload)
		assert.Equal(t, 1, pubs.count(), "not made again")
	})
	t.Run("conflict", func(t *testing.T) {
		s, pubs, _ := openFaulty(t, time.Minute)
		pubs.plan = []fault{pass, unsent}
		require.NoError(t, s.Append(ctx, nil, testEvent(t, "run_d", 1, false)))
		// Another server's write comes first (a takeover): the retry is
		// refused, and the journal's end is not this write.
		pubs.at, pubs.hook = 2, func() {
			_, err := s.js.(faultyJS).JetStream.Publish(ctx, eventsSubject+"run_d", testEvent(t, "run_d", 5, false).Data)
			require.NoError(t, err)
		}
		err := s.Append(ctx, nil, testEvent(t, "run_d", 2, false))
		require.ErrorIs(t, err, store.ErrConflict)
	})
	t.Run("gives up", func(t *testing.T) {
		s, pubs, _ := openFaulty(t, 300*time.Millisecond)
		pubs.always = unsent
		err := s.Append(ctx, nil, testEvent(t, "run_e", 1, false))
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.Greater(t, pubs.count(), 1, "made again within WriteRetry")
		assert.Empty(t, journalSeqs(t, s, "run_e"))
	})
	t.Run("no retry", func(t *testing.T) {
		s, pubs, _ := openFaulty(t, -1)
		pubs.plan = []fault{unsent}
		require.ErrorIs(t, s.Append(ctx, nil, testEvent(t, "run_f", 1, false)), context.DeadlineExceeded)
		assert.Equal(t, 1, pubs.count())
	})
	t.Run("run let go", func(t *testing.T) {
		s, pubs, _ := openFaulty(t, time.Hour)
		pubs.always = unsent
		ended := make(chan struct{})
		pubs.at, pubs.hook = 3, func() { close(ended) }
		wctx := context.WithValue(ctx, store.StopWritesKey{}, (<-chan struct{})(ended))
		err := s.Append(wctx, nil, testEvent(t, "run_i", 1, false))
		require.ErrorIs(t, err, context.DeadlineExceeded, "the last try's error")
		assert.Equal(t, 3, pubs.count(), "no try after the run was let go")
	})
	t.Run("context ended", func(t *testing.T) {
		s, pubs, _ := openFaulty(t, time.Hour)
		pubs.always = unsent
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		pubs.at, pubs.hook = 3, cancel
		err := s.Append(wctx, nil, testEvent(t, "run_g", 1, false))
		require.ErrorIs(t, err, context.DeadlineExceeded, "the last try's error")
		assert.Equal(t, 3, pubs.count(), "no try after the context ended")
	})
}

// TestAClaimWhoseAnswerIsLostIsMade: a run's claim written although its
// answer was lost is the run's (its retry is refused: the key exists);
// another server's claim of the same run still conflicts.
func TestAClaimWhoseAnswerIsLostIsMade(t *testing.T) {
	ctx := context.Background()
	s, _, creates := openFaulty(t, time.Minute)
	creates.plan = []fault{unanswered}
	require.NoError(t, s.Claim(ctx, "run_a", "me", []byte("state")))
	assert.Equal(t, 2, creates.count())
	owner, err := s.Driver(ctx, "run_a")
	require.NoError(t, err)
	assert.Equal(t, "me", owner)
	require.ErrorIs(t, s.Claim(ctx, "run_a", "other", []byte("state")), store.ErrConflict)
	require.ErrorIs(t, s.Claim(ctx, "run_a", "me", []byte("another state")), store.ErrConflict, "not this claim")
}

// TestARunRidesOutAJournalOutage: a run whose journal writes fail for a
// while, one of them written with its answer lost, goes on and finishes;
// the delegate is called once and the journal has each event once. Before,
// the first failed write stopped the run on this server for good, RUNNING.
func TestARunRidesOutAJournalOutage(t *testing.T) {
	s, pubs, _ := openFaulty(t, time.Minute)
	// The run's first write meets an outage (its first try unsent, its
	// second written but unanswered, its third refused: the journal moved
	// on), its second is written unanswered.
	pubs.plan = []fault{unsent, unanswered, pass, unanswered}
	d := controlstest.NewDelegates(map[string][]controlstest.Reply{"a": {controlstest.OK("fine")}})
	m, err := runs.New(runs.Config{Store: s, Delegates: d, Clock: controlstest.NewClock(), Owner: "me"})
	require.NoError(t, err)
	defer m.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	spec := &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_FallbackChain{FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"a"}}}}
	st, err := runstest.Start(m, ctx, "brief", spec, nil)
	require.NoError(t, err)
	var kinds []string
	require.NoError(t, m.Watch(ctx, st.GetRunId(), 0, func(e store.Event) error {
		ev, err := e.Decode()
		if err != nil {
			return err
		}
		kinds = append(kinds, controlstest.Kind(ev))
		return nil
	}))
	assert.Equal(t, []string{"run_started", "attempt_started", "attempt_finished", "run_finished"}, kinds)
	got, err := m.Get(ctx, st.GetRunId())
	require.NoError(t, err)
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, got.GetStatus())
	assert.Len(t, d.Calls(), 1, "called once")
	assert.Equal(t, []int64{1, 2, 3, 4}, journalSeqs(t, s, st.GetRunId()), "each event once")
	assert.Greater(t, pubs.count(), len(pubs.plan), "every fault was met")
	stored, err := s.State(ctx, st.GetRunId())
	require.NoError(t, err)
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, stored.GetStatus())
}

// TestClosingStopsAWriteBeingMadeAgain: a server that closes (or is
// killed) while a run's write is being made again through an outage lets
// the run go at once, for another server to take over, instead of trying
// for the rest of the write's retry.
func TestClosingStopsAWriteBeingMadeAgain(t *testing.T) {
	s, pubs, _ := openFaulty(t, time.Hour)
	pubs.always = unsent
	d := controlstest.NewDelegates(map[string][]controlstest.Reply{"a": {controlstest.OK("fine")}})
	m, err := runs.New(runs.Config{Store: s, Delegates: d, Clock: controlstest.NewClock(), Owner: "me", Lease: time.Hour})
	require.NoError(t, err)
	spec := &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_FallbackChain{FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"a"}}}}
	// The run's first write is its claim (claims.go): Start waits for it.
	started := make(chan error, 1)
	go func() {
		_, err := runstest.Start(m, context.Background(), "brief", spec, nil)
		started <- err
	}()
	require.Eventually(t, func() bool { return pubs.count() >= 2 }, 10*time.Second, time.Millisecond, "the first write is being made again")
	closed := make(chan struct{})
	go func() {
		m.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		t.Fatal("Close waits for a write that is made again for an hour")
	}
	select {
	case err := <-started:
		require.Error(t, err, "a run whose claim was never written is not accepted")
		assert.ErrorIs(t, err, runs.ErrUnavailable)
	case <-time.After(30 * time.Second):
		t.Fatal("Start waits for a write that is made again for an hour")
	}
	assert.Empty(t, d.Calls(), "nothing called: the run's first events were never written")
}

// TestNoWriteIsUnderWayPastTheLease: once a server has beaten, no try of a
// write may still be under way when its lease ends (another server may
// take its runs over then): a try's deadline is no later than the lease
// less its margin, and no try starts after that. Before, a try started
// just before the lease ended had the client's 5 s and could land after a
// takeover, fencing the new owner out.
func TestNoWriteIsUnderWayPastTheLease(t *testing.T) {
	s, pubs, _ := openFaulty(t, time.Hour)
	s.lease = 3 * time.Second
	beat := time.Now()
	s.beatAt.Store(beat.UnixNano())
	fence := beat.Add(s.lease - s.margin())
	pubs.always = hangs
	start := time.Now()
	err := s.Append(context.Background(), nil, testEvent(t, "run_l", 1, false))
	require.Error(t, err)
	assert.WithinDuration(t, fence, time.Now(), time.Second, "gave up at the fence, not a client timeout later")
	assert.Less(t, time.Since(start), s.lease, "returned within the lease")
	pubs.mu.Lock()
	deadlines := pubs.deadlines
	pubs.mu.Unlock()
	require.NotEmpty(t, deadlines)
	for i, d := range deadlines {
		require.False(t, d.IsZero(), "try %d has a deadline", i+1)
		assert.False(t, d.After(fence), "try %d's deadline %s is past the fence %s", i+1, d.Format(time.StampMilli), fence.Format(time.StampMilli))
	}
	// Past the fence nothing is tried.
	s.beatAt.Store(time.Now().Add(-s.lease).UnixNano())
	n := pubs.count()
	require.ErrorIs(t, s.Append(context.Background(), nil, testEvent(t, "run_l", 1, false)), errFenced)
	assert.Equal(t, n, pubs.count(), "not tried")
}

// TestBeatsDuringAnOutageExtendTheRetry: a write is made again for up to
// WriteRetry when the server's heartbeats keep landing, even past the
// lease of the beat before the write. Before, the lease bound was read
// once, so a WriteRetry longer than the lease did nothing.
func TestBeatsDuringAnOutageExtendTheRetry(t *testing.T) {
	s, pubs, _ := openFaulty(t, time.Hour)
	s.lease = 3 * time.Second
	s.beatAt.Store(time.Now().UnixNano())
	stopBeats := make(chan struct{})
	beatsDone := make(chan struct{})
	go func() {
		defer close(beatsDone)
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stopBeats:
				return
			case <-tick.C:
				s.beatAt.Store(time.Now().UnixNano())
			}
		}
	}()
	defer func() { close(stopBeats); <-beatsDone }()
	pubs.always = unsent
	start := time.Now()
	go func() {
		time.Sleep(2 * s.lease)
		pubs.mu.Lock()
		pubs.always = pass
		pubs.mu.Unlock()
	}()
	require.NoError(t, s.Append(context.Background(), nil, testEvent(t, "run_m", 1, false)), "made once the outage ended, two leases later")
	assert.Greater(t, time.Since(start), s.lease)
	assert.Equal(t, []int64{1}, journalSeqs(t, s, "run_m"))
}

// TestWhichStoreErrorsAreMadeAgain: JetStream's 503s for a server that
// refuses a write for good are not made again; those of a leader being
// elected, and of a stream over its -max-bytes (the janitor makes room),
// are; a full stream and a message too large are refusals once the
// retries are over.
func TestWhichStoreErrorsAreMadeAgain(t *testing.T) {
	for _, c := range []struct {
		code             jetstream.ErrorCode
		status           int
		transient, final bool
	}{
		{errCodeStoreFailed, 503, true, true},
		{errCodeInsufficientResources, 503, false, true},
		{jetstream.JSErrCodeJetStreamNotEnabled, 503, true, false},
		{10008, 503, true, false}, // cluster temporarily unavailable
		{jetstream.JSErrCodeStreamMessageExceedsMaximum, 400, false, true},
		{jetstream.JSErrCodeStreamWrongLastSequence, 400, false, false},
	} {
		err := &jetstream.APIError{Code: c.status, ErrorCode: c.code, Description: "x"}
		assert.Equal(t, c.transient, transient(err), "transient: code %d", c.code)
		assert.Equal(t, c.final, refusal(err), "refusal: code %d", c.code)
	}
	assert.True(t, refusal(fmt.Errorf("publishing: %w", nats.ErrMaxPayload)))
	assert.False(t, refusal(context.DeadlineExceeded))
}

// TestARefusedWriteEndsTheRun: a journal write the store refuses for good
// (a message larger than it takes) ends the run FAILED, with the reason,
// in a small run_finished written after the events the store took: the
// run's watchers end, and GetRun and the store say FAILED. Before, the run
// stayed RUNNING on its server for good, its watchers waiting.
func TestARefusedWriteEndsTheRun(t *testing.T) {
	s, pubs, _ := openFaulty(t, time.Minute)
	// run_started (before the chain's health check) and attempt_started
	// go in; attempt_finished and run_finished are refused; the
	// run_finished that says so goes in.
	pubs.plan = []fault{pass, pass, refused}
	d := controlstest.NewDelegates(map[string][]controlstest.Reply{"a": {controlstest.OK("fine")}})
	m, err := runs.New(runs.Config{Store: s, Delegates: d, Clock: controlstest.NewClock(), Owner: "me"})
	require.NoError(t, err)
	defer m.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	spec := &stubbornv1.ControlSpec{Kind: &stubbornv1.ControlSpec_FallbackChain{FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{"a"}}}}
	st, err := runstest.Start(m, ctx, "brief", spec, nil)
	require.NoError(t, err)
	var evs []*stubbornv1.RunEvent
	require.NoError(t, m.Watch(ctx, st.GetRunId(), 0, func(e store.Event) error {
		ev, err := e.Decode()
		evs = append(evs, ev)
		return err
	}))
	require.Len(t, evs, 3)
	assert.Equal(t, "attempt_started", controlstest.Kind(evs[1]))
	assert.Equal(t, evs[0].GetTime().AsTime().Add(0), evs[2].GetTime().AsTime(), "on the run's clock")
	end := evs[2].GetRunFinished().GetState()
	require.NotNil(t, end, "the last event is run_finished")
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_FAILED, end.GetStatus())
	assert.Contains(t, end.GetStatusReason(), "maximum payload")
	assert.Equal(t, stubbornv1.StatusReason_STATUS_REASON_STORE_REFUSED, end.GetStatusReasonCode())
	assert.Equal(t, "brief", end.GetTaskBrief())
	got, err := m.Get(ctx, st.GetRunId())
	require.NoError(t, err)
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_FAILED, got.GetStatus())
	stored, err := s.State(ctx, st.GetRunId())
	require.NoError(t, err)
	assert.Equal(t, stubbornv1.RunStatus_RUN_STATUS_FAILED, stored.GetStatus())
	assert.Equal(t, []int64{1, 2, 3}, journalSeqs(t, s, st.GetRunId()))
	assert.Len(t, d.Calls(), 1)
	require.Eventually(t, func() bool {
		owner, err := s.Driver(ctx, st.GetRunId())
		return err == nil && owner == ""
	}, 10*time.Second, 10*time.Millisecond, "its claim is released")
}
