package storetest_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/runs/memstore"
	"github.com/stubbornhq/stubborn/internal/runs/store"
	"github.com/stubbornhq/stubborn/internal/runs/store/storetest"
)

// Broken stores: the memory store with one clause broken each, and the
// clause of the suite that must catch it.
type staleAppend struct{ *memstore.Memory }

// Append forgets the writer's view: only the seqs fence a stale writer.
func (s staleAppend) Append(ctx context.Context, _ *store.Writer, evs ...store.Event) error {
	return s.Memory.Append(ctx, nil, evs...)
}

type everAlive struct{ *memstore.Memory }

func (everAlive) Alive(context.Context, string) (bool, error) { return true, nil }

type stateFound struct{ *memstore.Memory }

func (s stateFound) State(ctx context.Context, id string) (*stubbornv1.ControlState, error) {
	st, err := s.Memory.State(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return &stubbornv1.ControlState{RunId: id}, nil
	}
	return st, err
}

type sendPlain struct{ *memstore.Memory }

func (s sendPlain) Send(ctx context.Context, owner string, cmd *store.Command) (*stubbornv1.ControlState, error) {
	st, err := s.Memory.Send(ctx, owner, cmd)
	if err != nil {
		return nil, errors.New(err.Error())
	}
	return st, nil
}

type keyAlwaysFree struct{ *memstore.Memory }

func (s keyAlwaysFree) ReserveKey(ctx context.Context, key string, e store.KeyEntry) (store.KeyEntry, bool, error) {
	_ = s.Memory.ForgetKey(ctx, key, e.RunID)
	cur, _, err := s.Memory.ReserveKey(ctx, key, e)
	return cur, true, err
}

type keepsJournal struct{ *memstore.Memory }

func (s keepsJournal) DeleteRun(ctx context.Context, id string) error {
	evs, err := s.Events(ctx, id, 0)
	if err != nil {
		return err
	}
	if err := s.Memory.DeleteRun(ctx, id); err != nil || len(evs) == 0 {
		return err
	}
	return s.Append(ctx, nil, evs...)
}

type secondClaimWins struct{ *memstore.Memory }

func (s secondClaimWins) Claim(ctx context.Context, id, owner string, state []byte) error {
	_ = s.Release(ctx, id)
	return s.Memory.Claim(ctx, id, owner, state)
}

// mutants maps each broken store to the clause that must fail on it.
var mutants = map[string]struct {
	wrap   func(*memstore.Memory) store.Store
	clause string
}{
	"StaleAppend":     {func(m *memstore.Memory) store.Store { return staleAppend{m} }, "Journal/StaleWriterGetsConflictAndWritesNothing"},
	"EverAlive":       {func(m *memstore.Memory) store.Store { return everAlive{m} }, "Ownership/LeaseExpiresWithoutBeats"},
	"StateFound":      {func(m *memstore.Memory) store.Store { return stateFound{m} }, "States/StateOfUnknownRunIsErrNotFound"},
	"SendPlain":       {func(m *memstore.Memory) store.Store { return sendPlain{m} }, "Commands/SendToUnservedOwnerIsErrNotServing"},
	"KeyAlwaysFree":   {func(m *memstore.Memory) store.Store { return keyAlwaysFree{m} }, "Keys/ReserveKeyOnce"},
	"KeepsJournal":    {func(m *memstore.Memory) store.Store { return keepsJournal{m} }, "Deletion/DeleteRunRemovesItWhole"},
	"SecondClaimWins": {func(m *memstore.Memory) store.Store { return secondClaimWins{m} }, "Ownership/SecondClaimIsErrConflict"},
}

// TestMain runs brokenStores instead of the tests in the process that
// TestSuiteCatchesBrokenStores starts, where its failures are expected.
func TestMain(m *testing.M) {
	if os.Getenv("STORETEST_BROKEN") == "1" {
		testing.Main(func(string, string) (bool, error) { return true, nil },
			[]testing.InternalTest{{Name: "BrokenStores", F: brokenStores}}, nil, nil)
	}
	os.Exit(m.Run())
}

func brokenStores(t *testing.T) {
	for name, m := range mutants {
		t.Run(name, func(t *testing.T) {
			storetest.Run(t, func(_ *testing.T, lease time.Duration) func() store.Store {
				s := m.wrap(memstore.NewMemory(lease))
				return func() store.Store { return s }
			})
		})
	}
	t.Run("UnusedBreak", func(t *testing.T) {
		storetest.Run(t, func(_ *testing.T, lease time.Duration) func() store.Store {
			s := memstore.NewMemory(lease)
			return func() store.Store { return s }
		}, storetest.Break{Clause: "States/RawStateOfUnknownRunIsNil", Why: "it holds on Memory"})
	})
}

// TestSuiteCatchesBrokenStores runs the suite against stores that each
// break one clause: that clause's subtest must fail, and a known break
// that holds must fail too.
func TestSuiteCatchesBrokenStores(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), "STORETEST_BROKEN=1")
	out, err := cmd.CombinedOutput()
	require.Error(t, err, "the suite passed on broken stores:\n%s", out)
	failed := func(clause string) bool { return strings.Contains(string(out), "--- FAIL: BrokenStores/"+clause+" ") }
	for name, m := range mutants {
		assert.True(t, failed(name+"/"+m.clause), "the suite does not catch store %s: %s passes", name, m.clause)
	}
	assert.True(t, failed("UnusedBreak/States/RawStateOfUnknownRunIsNil"), "a known break that holds passes")
	if t.Failed() {
		t.Logf("the suite on broken stores:\n%s", out)
	}
	// Every mutant fails for its clause, not for all of them.
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, "--- FAIL: BrokenStores/StaleAppend/Keys") {
			t.Errorf("a broken journal fails the keys' clauses: %s", line)
		}
	}
}
