package store

import (
	"context"
	"errors"
	"time"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// Store keeps runs durably: the journal of each run's events, a snapshot
// of each run's state, which server drives each run, which servers are
// alive, the idempotency keys, deletions and the listing of runs. The
// Manager (package runs) is the same over every Store and finds nothing
// by type assertion: a store without a capability says so through the
// contract (an index that is never ready, claims never in the journal, no
// limit on admissions). jsstore.JetStream is the production store;
// memstore.Memory serves tests and the -memory flag.
//
// It is made of one interface per concern, each what a part of the
// Manager needs: a run's journal writer (run.flush, run.endRefused)
// appends to the Journal and saves to the States; watching follows the
// Journal; GetRun and ListRuns read the States and the Listing; heartbeats,
// claims, takeover scans and resumes go through Ownership (resumes read the
// Journal too); CancelRun and DecideRun for a run another server drives go
// through Commands; idempotency keys through Keys; DeleteRun through
// Deletion. The contract test suite (storetest) holds every store to it.
type Store interface {
	Journal
	States
	Ownership
	Commands
	Keys
	Deletion
	Listing

	// Transient reports whether err, from one of the store's calls, is the
	// store not answering for a moment (no answer in time, no server to
	// take the call, a reconnect): the same call may succeed if made
	// again, so a client is told UNAVAILABLE, not INTERNAL.
	Transient(err error) bool
	// Close releases the store's resources.
	Close() error
}

// Writer is one writer's part in a run's journal writes: each copy of a
// run has its own, so that a copy that was replaced — by another server's
// takeover, or by this server's own resume of the run — is fenced by the
// journal's end like any other stale writer, whatever the store read
// meanwhile. Only the store reads and moves Cursor; the writer hands the
// same Writer to each of its appends, one at a time.
type Writer struct {
	// Cursor is where this writer's view of the journal ends, in the
	// store's own terms (0: the journal is empty): set by JournalFrom and
	// moved by each Append.
	Cursor uint64
	// Claimer is the server that claimed a new run with its journal's
	// first write (Ownership.ClaimsInJournal), "" for a run claimed with
	// an owners entry: every write of the claiming copy says so.
	Claimer string
}

// Journal keeps each run's events, in seq order, and fences out a server
// that lost the run.
type Journal interface {
	// Append records evs, consecutive events of one run in seq order (at
	// least one), as one write: all of them or none. The first follows the
	// journal's last event (seq 1 for a new run): the caller numbers them
	// (the engine's record), and a store need not check it. It fails with
	// ErrConflict when the run's journal does not end where w's view of it
	// does (w nil: the store's own view, which Events makes current) —
	// another writer has written since — so a server that lost a run can
	// never write to it. On success w's view moves to the new end. The
	// events' Data is never changed: a store may keep it. A write made
	// again after a failure stops once the channel under StopWritesKey in
	// ctx (if any) is closed.
	Append(ctx context.Context, w *Writer, evs ...Event) error
	// Events returns the run's events with seq > after, in order, and makes
	// this store's view of the journal current (see Append).
	Events(ctx context.Context, runID string, after int64) ([]Event, error)
	// JournalFrom returns the run's whole journal and sets w's view to
	// where it ends: what a copy of the run resumed from it starts from.
	JournalFrom(ctx context.Context, runID string, w *Writer) ([]Event, error)
	// Follow calls fn with the run's events with seq > after, first those
	// recorded and then each new one as it is recorded, until run_finished
	// has been sent (it returns nil), ctx ends or fn fails.
	Follow(ctx context.Context, runID string, after int64, fn func(Event) error) error
	// EventLimit is the largest event's encoding the store takes: at most
	// MaxEventBytes. A larger event is recorded with its texts cut
	// (controls.BoundEvent).
	EventLimit() int
	// JournalLost tells a run's journal that was lost (a state saved after
	// its first write, the store's files damaged), and why, from one never
	// written (its server stopped between the claim and the first write):
	// the first must not be resumed from the claim. A store that cannot
	// lose a journal reports false.
	JournalLost(ctx context.Context, runID string) (lost bool, why string, err error)
	// FinalInJournal says whether State and States read a finished run's
	// final state from the run_finished its journal ends with: then the
	// Manager does not save the final state of a run that saved none
	// before, one write less for most runs. A run that saved one (or may
	// have: a failed save, a run taken over) saves its final state too, so
	// that no stale state is kept.
	FinalInJournal() bool
}

// States keeps a snapshot of each run's state.
type States interface {
	// PutState saves the snapshot of run runID's state, encoded (a
	// stubborn.v1.ControlState). state is never changed: a store may keep
	// it.
	PutState(ctx context.Context, runID string, state []byte) error
	// State returns a run's last saved state, or ErrNotFound. (A
	// FinalInJournal store gives a finished run's final state.)
	State(ctx context.Context, runID string) (*stubbornv1.ControlState, error)
	// States calls fn with every run's state (as State gives it), once
	// each, in no particular order, until fn returns false.
	States(ctx context.Context, fn func(*stubbornv1.ControlState) bool) error
	// RawState returns the encoding of the run's latest state, as State
	// would choose it, without decoding it; nil when there is none (the
	// deletion of a run whose records cannot be read). tenant is the run's
	// tenant as another record of the run names it, if one does (known).
	RawState(ctx context.Context, runID string) (state []byte, tenant string, known bool, err error)
	// Admit returns ErrStoreFull when the store has no room for a new run
	// whose encoded state is size bytes: Manager.Start refuses the run
	// before it claims it. A store that makes room by itself returns nil.
	Admit(ctx context.Context, size int) error
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

	// ClaimsInJournal says whether a new run is claimed with its
	// journal's first write, and let go of with its last (Writer.Claimer),
	// rather than with Claim: then the store keeps a mark of each server's
	// claims without owners entries, and finds a dead server's runs from
	// its mark. A store that says false is never asked for marks.
	ClaimsInJournal() bool
	// ClaimMarks calls fn with every server's mark, its revision and when
	// it was written.
	ClaimMarks(ctx context.Context, fn func(owner string, mark, rev uint64, written time.Time)) error
	// JournalOrphans calls fn with each run claimed in its journal, after
	// its server's mark, by a server of marks, that has neither ended nor
	// an owners entry.
	JournalOrphans(ctx context.Context, marks map[string]uint64, fn func(runID, owner string)) error
	// DropMark deletes owner's mark if it is still at revision rev.
	DropMark(ctx context.Context, owner string, rev uint64) error
}

// Commands carries operations on a run to the server that drives it.
type Commands interface {
	// Serve answers commands (cancel, decide) sent to owner's runs by other
	// servers, with handle, until stop is called; ctx is the parent of
	// handle's contexts. When it returns, commands sent reach handle.
	Serve(ctx context.Context, owner string, handle func(context.Context, *Command) (*stubbornv1.ControlState, error)) (stop func(), err error)
	// Send delivers a command to the server that drives cmd.RunId; it
	// fails with ErrNotServing when no server serves owner's commands.
	Send(ctx context.Context, owner string, cmd *Command) (*stubbornv1.ControlState, error)
}

// Keys keeps the idempotency keys, each naming a run for a window.
type Keys interface {
	// ReserveKey writes e as key's entry unless it has one within its
	// window; then it returns that one and reserved false.
	ReserveKey(ctx context.Context, key string, e KeyEntry) (current KeyEntry, reserved bool, err error)
	// ReplaceKey writes e over old, key's current entry, unless it
	// changed meanwhile; it returns e's revision, 0 when not replaced.
	ReplaceKey(ctx context.Context, key string, old, e KeyEntry) (rev uint64, err error)
	// DropKey deletes key's entry if it is still e.
	DropKey(ctx context.Context, key string, e KeyEntry) error
	// ForgetKey deletes key's entry if it names run runID (a run
	// deleted).
	ForgetKey(ctx context.Context, key, runID string) error
	// ForgetKeysOf deletes every key's entry that names run runID,
	// whatever the key (a run whose options cannot be read).
	ForgetKeysOf(ctx context.Context, runID string) error
}

// Deletion deletes runs whole and remembers which it deleted.
type Deletion interface {
	// DeleteRun deletes a run whole, and tells every server that shares
	// the store to forget it.
	DeleteRun(ctx context.Context, runID string) error
	// OnForget has fn called with the id of every run a server deletes
	// (this one's included).
	OnForget(fn func(runID string))
	// DeletedRun reports whether run runID was deleted.
	DeletedRun(ctx context.Context, runID string) (bool, error)
}

// Listing lists runs without reading every run's state, and follows them
// as they change: a store that keeps no index says so (Summaries not ok,
// ErrNoIndex from TenantRuns and ClaimedRuns), and the Manager reads the
// States instead. Every store follows its runs (FollowSummaries).
type Listing interface {
	// Summaries calls fn with the summary of each of tenant's runs; ok
	// false says the index is not to be trusted (yet, or ever).
	Summaries(ctx context.Context, tenant string, fn func(*stubbornv1.RunSummary) bool) (ok bool, err error)
	// FollowSummaries calls fn with nil and "" once it follows, then with
	// each of tenants' runs' summaries as they change, or the id of one
	// deleted, until ctx ends or fn fails (or the store ends the follow:
	// a follower that fell behind).
	FollowSummaries(ctx context.Context, tenants []string, fn func(sum *stubbornv1.RunSummary, deleted string) error) error
	// IndexEnd tells the index of a run's end written by a write that
	// failed here, or by a server that died before it noted it.
	IndexEnd(runID string, final Event)
	// TenantRuns calls fn with each of tenants' runs and its listing key,
	// without decoding any run's state whole, another tenant's dropped
	// before anything of it is kept; ErrNoIndex when the store cannot.
	TenantRuns(ctx context.Context, tenants []string, fn func(runID string, key ListKey)) error
	// ClaimedRuns is TenantRuns for the runs that have a driver, from
	// their claims; ErrNoIndex when the store cannot.
	ClaimedRuns(ctx context.Context, tenants []string, fn func(runID string, key ListKey)) error
}

// Command is an operation on a run that only its driver can carry out.
type Command struct {
	// RunID names the run.
	RunID string `json:"run_id"`
	// Cancel cancels the run.
	Cancel bool `json:"cancel,omitempty"`
	// Decision answers a run awaiting a decision.
	Decision stubbornv1.Decision `json:"decision,omitempty"`
	// SpendLimit is the run's new spend limit, set with a Decision.
	SpendLimit *SpendLimit `json:"spend_limit,omitempty"`
}

// SpendLimit is stubbornv1.SpendLimit as a Command carries it (JSON).
type SpendLimit struct {
	MaxCost        float64 `json:"max_cost,omitempty"`
	MaxTotalTokens int64   `json:"max_total_tokens,omitempty"`
	OnExhausted    int32   `json:"on_exhausted,omitempty"`
}

// CommandLimit is l as a Command carries it; nil for nil.
func CommandLimit(l *stubbornv1.SpendLimit) *SpendLimit {
	if l == nil {
		return nil
	}
	return &SpendLimit{MaxCost: l.GetMaxCost(), MaxTotalTokens: l.GetMaxTotalTokens(), OnExhausted: int32(l.GetOnExhausted())}
}

// Proto is l as the API has it; nil for nil.
func (l *SpendLimit) Proto() *stubbornv1.SpendLimit {
	if l == nil {
		return nil
	}
	return &stubbornv1.SpendLimit{MaxCost: l.MaxCost, MaxTotalTokens: l.MaxTotalTokens, OnExhausted: stubbornv1.OnExhausted(l.OnExhausted)}
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

// FenceMargin is how long before its lease ends a server's last write may
// be under way, at most: the time a request already sent may take to be
// carried out (a quarter of a shorter lease). A server counts as possibly
// dead to the others that long before its lease ends.
const FenceMargin = time.Second

// StopWritesKey is the context key of a channel (<-chan struct{}) closed
// when a write made with the context is not to be made again after a
// failure: the run that makes it was let go.
type StopWritesKey struct{}
