package runs

import "github.com/stubbornhq/stubborn/internal/runs/store"

// Errors of the store that the Manager's callers may meet, under the names
// the server maps to gRPC codes.
var (
	// ErrNotFound: no run has that id.
	ErrNotFound = store.ErrNotFound
	// ErrConflict: a write lost to another owner's.
	ErrConflict = store.ErrConflict
	// ErrUnreadable: a run's stored records cannot be decoded.
	ErrUnreadable = store.ErrUnreadable
	// ErrStoreFull: the store has no room for a new run.
	ErrStoreFull = store.ErrStoreFull
	// ErrNoIndex: the store keeps no index of runs to follow.
	ErrNoIndex = store.ErrNoIndex
)

// Event is one recorded event of a run (store.Event): what Watch hands
// out.
type Event = store.Event

// MaxEventBytes bounds a recorded event's encoding (store.MaxEventBytes).
const MaxEventBytes = store.MaxEventBytes

// DefaultLease is how long a server that stops beating keeps its runs
// before other servers take them over.
const DefaultLease = store.DefaultLease
