package notify

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"sync"
	"time"
)

// Record is a notice to one target, as a Queue keeps it.
type Record struct {
	// ID is the notice's id (Stubborn-Notice-Id): the same for every
	// target and every try, so that a receiver deduplicates by it.
	ID    string `json:"id"`
	RunID string `json:"run_id"`
	// URL, SecretEnv and Format name the target; its secret is looked up
	// in the config in use when the notice is posted, never stored.
	URL       string `json:"url"`
	SecretEnv string `json:"secret_env"`
	Format    string `json:"format,omitempty"`
	// Body is what the target gets, encoded.
	Body    []byte    `json:"body,omitempty"`
	Created time.Time `json:"created"`
	// Attempts counts the posts made so far; NextAt is when the next may
	// be made.
	Attempts int       `json:"attempts,omitempty"`
	NextAt   time.Time `json:"next_at"`
	// Owner is the replica that claimed the record until ClaimUntil (a
	// post in flight); another may claim it after.
	Owner      string    `json:"owner,omitempty"`
	ClaimUntil time.Time `json:"claim_until"`
	// State is "" while the notice is to be delivered, then one of
	// stateDelivered, stateGaveUp; stateUsed marks a decision link used.
	State string `json:"state,omitempty"`
	// LastError says why the last post failed.
	LastError string `json:"last_error,omitempty"`
}

// Record states.
const (
	stateDelivered = "delivered"
	stateGaveUp    = "gave_up"
	stateUsed      = "used"
)

// Entry is a record and its revision in a Queue.
type Entry struct {
	Key    string
	Rev    uint64
	Record Record
}

// ErrConflict is Queue.Update's and Queue.Delete's error when the record
// changed since the revision given (another replica claimed it).
var ErrConflict = errors.New("notify: the record changed meanwhile")

// Queue keeps the records to deliver, durable as the runs' store is, and
// shared by the replicas on it. Settled records (delivered, given up, used
// links) are kept for settledTTL, so that a notice added again (a sweep)
// is not posted twice.
type Queue interface {
	// Add stores r under key unless key is taken (added false then).
	Add(ctx context.Context, key string, r Record) (added bool, err error)
	// Pending returns the records not settled, as this replica last saw
	// them.
	Pending() []Entry
	// Update replaces key's record if it is still at rev, returning the
	// new revision; ErrConflict otherwise.
	Update(ctx context.Context, key string, rev uint64, r Record) (uint64, error)
	// Get returns key's record, and whether there is one.
	Get(ctx context.Context, key string) (Entry, bool, error)
	// Delete removes key's record if it is still at rev.
	Delete(ctx context.Context, key string, rev uint64) error
	// SigningKey returns the key decision links are signed with: made
	// once, the same for every replica on the store.
	SigningKey(ctx context.Context) ([]byte, error)
	// Close releases what the queue holds.
	Close()
}

// settledTTL is how long a settled record is kept: past MaxAge's
// deliveries and a decision link's longest life (maxLinkLife).
const settledTTL = 8 * 24 * time.Hour

// Memory is a Queue in process, for the memory store: its notices last
// as long as its runs do.
type Memory struct {
	mu      sync.Mutex
	entries map[string]Entry // guarded by mu
	rev     uint64           // guarded by mu
	key     []byte
	now     func() time.Time
}

var _ Queue = (*Memory)(nil)

// NewMemory returns an empty Memory queue with a random signing key.
func NewMemory() *Memory {
	key := make([]byte, 32)
	_, _ = rand.Read(key) // never fails (crypto/rand)
	return &Memory{entries: map[string]Entry{}, key: key, now: time.Now}
}

// Add implements Queue.
func (m *Memory) Add(_ context.Context, key string, r Record) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.pruneLocked()
	if _, ok := m.entries[key]; ok {
		return false, nil
	}
	m.rev++
	m.entries[key] = Entry{Key: key, Rev: m.rev, Record: copyRecord(r)}
	return true, nil
}

// Pending implements Queue.
func (m *Memory) Pending() []Entry {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []Entry
	for _, e := range m.entries {
		if e.Record.State == "" {
			out = append(out, e)
		}
	}
	return out
}

// Update implements Queue.
func (m *Memory) Update(_ context.Context, key string, rev uint64, r Record) (uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.entries[key]
	if !ok || e.Rev != rev {
		return 0, ErrConflict
	}
	m.rev++
	m.entries[key] = Entry{Key: key, Rev: m.rev, Record: copyRecord(r)}
	return m.rev, nil
}

// Get implements Queue.
func (m *Memory) Get(_ context.Context, key string) (Entry, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.entries[key]
	return e, ok, nil
}

// Delete implements Queue.
func (m *Memory) Delete(_ context.Context, key string, rev uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.entries[key]
	if !ok || e.Rev != rev {
		return ErrConflict
	}
	delete(m.entries, key)
	return nil
}

// SigningKey implements Queue.
func (m *Memory) SigningKey(context.Context) ([]byte, error) { return m.key, nil }

// Close implements Queue.
func (m *Memory) Close() {}

// pruneLocked drops the settled records older than settledTTL.
func (m *Memory) pruneLocked() {
	cut := m.now().Add(-settledTTL)
	for k, e := range m.entries {
		if e.Record.State != "" && e.Record.Created.Before(cut) {
			delete(m.entries, k)
		}
	}
}

func copyRecord(r Record) Record {
	r.Body = append([]byte(nil), r.Body...)
	return r
}

func encodeRecord(r Record) ([]byte, error) { return json.Marshal(r) }

func decodeRecord(b []byte) (Record, error) {
	var r Record
	err := json.Unmarshal(b, &r)
	return r, err
}
