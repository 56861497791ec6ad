package runs

import (
	"context"
	"errors"
	"time"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// Store keeps runs durably: the journal of each run's events, a snapshot
// of each run's state, which server drives each run, and which servers are
// alive. The Manager is the same over every Store; JetStream is the
// production one, Memory serves tests and the -store memory flag.
//
// It is made of one interface per concern, each what a part of the
// Manager needs: a run's journal writer (run.flush, run.endRefused)
// appends to the Journal and saves to the States; watching follows the
// Journal; GetRun and ListRuns read the States; heartbeats, claims,
// takeover scans and resumes go through Ownership (resumes read the
// Journal too); CancelRun and DecideRun for a run another server drives go
// through Commands.
type Store interface {
	Journal
	States
	Ownership
	Commands

	// Close releases the store's resources.
	Close() error
}

// Journal keeps each run's events, in seq order, and fences out a server
// that lost the run.
type Journal interface {
	// Append records evs, consecutive events of one run in seq order (at
	// least one), as one write: all of them or none. It fails with
	// ErrConflict when the run's journal does not end where this store's
	// view of it does — another owner has written since — so a server that
	// lost a run can never write to it. The events' Data is never changed:
	// a store may keep it.
	Append(ctx context.Context, evs ...Event) error
	// Events returns the run's events with seq > after, in order, and makes
	// this store's view of the journal current (see Append).
	Events(ctx context.Context, runID string, after int64) ([]Event, error)
	// Follow calls fn with the run's events with seq > after, first those
	// recorded and then each new one as it is recorded, until run_finished
	// has been sent (it returns nil), ctx ends or fn fails.
	Follow(ctx context.Context, runID string, after int64, fn func(Event) error) error
}

// States keeps a snapshot of each run's state.
type States interface {
	// PutState saves the snapshot of run runID's state, encoded (a
	// stubborn.v1.ControlState). state is never changed: a store may keep
	// it.
	PutState(ctx context.Context, runID string, state []byte) error
	// State returns a run's last saved state, or ErrNotFound. (A
	// finalInJournal store gives a finished run's final state.)
	State(ctx context.Context, runID string) (*stubbornv1.ControlState, error)
	// States calls fn with every run's state (as State gives it), once
	// each, in no particular order, until fn returns false.
	States(ctx context.Context, fn func(*stubbornv1.ControlState) bool) error
}

// Ownership says which servers are alive and which server drives each
// run.
type Ownership interface {
	// Beat says owner is alive; it must be repeated within the store's
	// lease time, after which owner counts as dead.
	Beat(ctx context.Context, owner string) error
	// Alive reports whether owner has beaten within the lease time.
	Alive(ctx context.Context, owner string) (bool, error)
	// Leave says owner stops now: it counts as dead at once, and Live
	// reports it as left for a lease time.
	Leave(ctx context.Context, owner string) error
	// Live calls fn with every owner that has beaten within the lease time
	// (left false), and with every owner that left within it (left true):
	// a server looking for runs to take over learns of a departure even
	// when it never saw that owner beat.
	Live(ctx context.Context, fn func(owner string, left bool)) error
	// Claim records owner as the driver of a new run, and state (encoded,
	// as for PutState; nil: none) as the run's state until PutState saves
	// another: one write accepts a run. ErrConflict if the run has a
	// driver.
	Claim(ctx context.Context, runID, owner string, state []byte) error
	// Driver returns the run's driver, or "" when it has none.
	Driver(ctx context.Context, runID string) (string, error)
	// Owners calls fn with every run that has a driver, and the driver.
	Owners(ctx context.Context, fn func(runID, owner string) bool) error
	// TakeOver makes owner the driver of runID if its driver is still from
	// (compare-and-set). ErrConflict if another server got there first.
	TakeOver(ctx context.Context, runID, from, owner string) error
	// Release forgets the driver of a finished run.
	Release(ctx context.Context, runID string) error
}

// Commands carries operations on a run to the server that drives it.
type Commands interface {
	// Serve answers commands (cancel, decide) sent to owner's runs by other
	// servers, with handle, until stop is called; ctx is the parent of
	// handle's contexts. When it returns, commands sent reach handle.
	Serve(ctx context.Context, owner string, handle func(context.Context, *Command) (*stubbornv1.ControlState, error)) (stop func(), err error)
	// Send delivers a command to the server that drives cmd.RunId.
	Send(ctx context.Context, owner string, cmd *Command) (*stubbornv1.ControlState, error)
}

// Command is an operation on a run that only its driver can carry out.
type Command struct {
	// RunID names the run.
	RunID string `json:"run_id"`
	// Cancel cancels the run.
	Cancel bool `json:"cancel,omitempty"`
	// Decision answers a run awaiting a decision.
	Decision stubbornv1.Decision `json:"decision,omitempty"`
}

// ErrConflict is returned when a write loses to another owner's.
var ErrConflict = errors.New("conflicting write: the run changed hands")

// ErrRefused is returned (in a *RefusedError) when the store refuses a
// write for good: a message larger than it takes, a stream that is full. Made
// again, the same write would be refused again.
var ErrRefused = errors.New("the store refuses the write")

// RefusedError is a refused Append: Written of its events were written
// before (a store that writes them in several messages), the rest not.
type RefusedError struct {
	Written int
	Err     error
}

func (e *RefusedError) Error() string { return ErrRefused.Error() + ": " + e.Err.Error() }

func (e *RefusedError) Unwrap() []error { return []error{ErrRefused, e.Err} }

// MaxEventBytes bounds a recorded event's encoding: it is sent whole to
// each watcher, below gRPC's default 4 MiB message limit. A store whose
// messages are smaller says so (eventLimit).
const MaxEventBytes = 3 << 20

// cursorReader is a Store whose appends from a run's writer are fenced by
// that writer's own view of the journal (journalCursor, carried by the
// writer's context under cursorKey) rather than by the store's: it reads
// a run's whole journal and sets cur to where it ends, for the copy of
// the run that resumes from it.
type cursorReader interface {
	journalFrom(ctx context.Context, runID string, cur *journalCursor) ([]Event, error)
}

// eventLimit is a Store whose messages are smaller than MaxEventBytes:
// the largest event it takes. A larger event is recorded with its texts
// cut (controls.BoundEvent).
type eventLimit interface {
	eventLimit() int
}

// journalLoss is a Store that can tell a run's journal that was lost (a
// state saved after its first write, the store's files damaged) from one
// never written (its server stopped between the claim and the first
// write): the first must not be resumed from the claim.
type journalLoss interface {
	journalLost(ctx context.Context, runID string) (lost bool, why string, err error)
}

// finalInJournal is a Store that may read a finished run's final state
// from the run_finished its journal ends with, in State and States, and
// says whether it does: then the Manager does not save the final state of
// a run that saved none before (Manager.admit, run.flush), one write less
// for most runs. A run that saved one (or may have: a failed save, a run
// taken over) saves its final state too, so that no stale state is kept.
type finalInJournal interface {
	Store
	finalInJournal() bool
}

// journalClaims is a Store that may claim a new run with its journal's
// first write, and let go of it with its last, rather than with an
// owners entry of its own (claims.go): it says whether it does, keeps a
// mark of each server's claims without owners entries, and finds a dead
// server's runs from its mark.
type journalClaims interface {
	Store
	claimsInJournal() bool
	// claimMarks calls fn with every server's mark, its revision and
	// when it was written.
	claimMarks(ctx context.Context, fn func(owner string, mark, rev uint64, written time.Time)) error
	// journalOrphans calls fn with each run claimed in its journal, after
	// its server's mark, by a server of marks, that has neither ended nor
	// an owners entry.
	journalOrphans(ctx context.Context, marks map[string]uint64, fn func(runID, owner string)) error
	// dropMark deletes owner's mark if it is still at revision rev.
	dropMark(ctx context.Context, owner string, rev uint64) error
}

// admission is a Store that may have no room for a new run: admit
// returns ErrStoreFull then, and Manager.Start refuses the run before it
// claims it. size is the size of the run's encoded state.
type admission interface {
	Store
	admit(ctx context.Context, size int) error
}

// stopWritesKey is the context key of a channel (<-chan struct{}) closed
// when a write made with the context is not to be made again after a
// failure: the run that makes it was let go.
type stopWritesKey struct{}
