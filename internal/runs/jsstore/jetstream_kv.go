package jsstore

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/runs/store"
)

// PutState saves a snapshot.
func (s *JetStream) PutState(ctx context.Context, runID string, state []byte) error {
	// A run claimed in its journal that saves a state (it waits) gets its
	// owners entry first, as a claim came before any state: a run whose
	// state is saved is found by its owners entry even if its journal is
	// lost (claims.go).
	// A final state (saved after run_finished) needs none: the run has
	// ended, and the entry would be released at once.
	if !store.IsTerminal(stateStatus(state)) {
		s.writeClaim(ctx, runID)
	}
	err := s.write(ctx, func(ctx context.Context) error {
		_, err := s.states.Put(ctx, runID, state)
		return err
	}, nil)
	if err == nil {
		s.index.note(runID, state)
	}
	return err
}

// stateStatus reads the status of an encoded ControlState without
// decoding the rest.
func stateStatus(b []byte) stubbornv1.RunStatus { return store.StatusField(b, stateStatusField) }

// stateStatusField is ControlState.status's field number.
const stateStatusField = 2

// State returns a run's state: the one its journal's run_finished
// carries once it has finished, else the last one saved, else the one its
// claim carries. A run writes its claim, its journal (and its saved
// states) and then lets its claim go, in that order, and State reads them
// in that order: a run whose claim is gone has finished, and its journal
// says so, or never was. The journal is read unless the saved state is
// final already: a run that saved no state before its end does not save
// its last one (finalInJournal), and a run whose last save failed has a
// stale one.
func (s *JetStream) State(ctx context.Context, runID string) (*stubbornv1.ControlState, error) {
	if !validKey(runID) {
		return nil, fmt.Errorf("%w: %.64q", store.ErrNotFound, runID)
	}
	var state []byte
	e, err := s.states.Get(ctx, runID)
	switch {
	case err == nil:
		// A saved state that does not decode may be stale: its journal's
		// end, when it has one, is the run's state.
		if st, err := store.DecodeState(e.Value()); err == nil && store.IsTerminal(st.GetStatus()) {
			return st, nil
		}
		state = e.Value()
	case !errors.Is(err, jetstream.ErrKeyNotFound):
		return nil, err
	default:
		o, err := s.owners.Get(ctx, runID)
		if err == nil {
			_, state = parseOwnerEntry(o.Value())
		} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil, err
		}
	}
	last, err := s.lastEvent(ctx, runID)
	if err != nil {
		return nil, err
	}
	if end := last.StateBytes(); last.Finished && len(end) > 0 {
		state = end
	}
	if len(state) == 0 && last.Data != nil {
		// Claimed in its journal (claims.go): run_started has its state.
		if state, err = s.firstState(ctx, runID); err != nil {
			return nil, err
		}
	}
	if len(state) == 0 {
		return nil, fmt.Errorf("%w: %.64q", store.ErrNotFound, runID)
	}
	return store.ReadState(runID, state)
}

// lastEvent returns the last event of the run's journal, undecoded
// (lastRawEvent): the zero Event when it has none; ErrUnreadable when its
// last message is not an event at all.
func (s *JetStream) lastEvent(ctx context.Context, runID string) (store.Event, error) {
	msg, err := s.events.GetLastMsgForSubject(ctx, eventsSubject+runID)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return store.Event{}, nil
	}
	if err != nil {
		return store.Event{}, err
	}
	last, err := lastRawEvent(runID, msg.Data, msg.Header)
	if err != nil {
		return store.Event{}, store.UnreadableRun(runID, err)
	}
	return last, nil
}

// finalInJournal: State and States read a finished run's state from its
// run_finished, so that a run that saved none before its end is not made
// to save its last one (a write per run), unless the config says to save
// it anyway (SaveFinalStates).
//
// Compatibility path, for servers before 2026-11-30 sharing the store
// (JetStreamConfig.SaveFinalStates): the store's only branch on it.
func (s *JetStream) FinalInJournal() bool { return !s.saveFinal }

// States calls fn with every run's state: a finished run's from its
// journal's run_finished, the others' the last saved, else their claim's.
// It reads the claims, then the saved states, then the journals' last
// messages, the order in which a run writes them: a run that finishes
// meanwhile is still listed (with one of its states), not missed.
func (s *JetStream) States(ctx context.Context, fn func(*stubbornv1.ControlState) bool) error {
	all := map[string][]byte{}
	if err := eachEntry(ctx, s.owners, jetstream.AllKeys, func(e jetstream.KeyValueEntry) (bool, error) {
		if _, state := parseOwnerEntry(e.Value()); len(state) > 0 {
			all[e.Key()] = state
		}
		return true, nil
	}); err != nil {
		return err
	}
	if err := eachEntry(ctx, s.states, jetstream.AllKeys, func(e jetstream.KeyValueEntry) (bool, error) {
		all[e.Key()] = e.Value()
		return true, nil
	}); err != nil {
		return err
	}
	bad := map[string]error{}
	var claimedOnly []string
	if err := s.lastRawEvents(ctx, func(runID string, last store.Event, err error) {
		if err != nil {
			bad[runID] = err // its journal ends in what no one can read
			return
		}
		if state := last.StateBytes(); last.Finished && len(state) > 0 {
			all[runID] = state
		} else if !last.Finished && all[runID] == nil {
			claimedOnly = append(claimedOnly, runID)
		}
	}); err != nil {
		return err
	}
	// Claimed in their journals (claims.go): run_started has their state.
	for _, runID := range claimedOnly {
		if all[runID] != nil {
			continue
		}
		state, err := s.firstState(ctx, runID)
		if err != nil {
			bad[runID] = err
			continue
		}
		if len(state) > 0 {
			all[runID] = state
		}
	}
	for runID, err := range bad {
		delete(all, runID)
		s.logUnreadable(runID, err)
	}
	// One run that does not decode costs that run only (issue 30).
	for runID, state := range all {
		st, err := store.DecodeState(state)
		if err != nil {
			s.logUnreadable(runID, err)
			continue
		}
		if !fn(st) {
			return nil
		}
	}
	return nil
}

// lastEventsIdle bounds lastRawEvents' wait for its next message, and is
// how long its consumer outlives it on the server.
const lastEventsIdle = 5 * time.Second

// An owners entry is the driver's name after ownerMark and its length (a
// uvarint), followed by the run's state as it was claimed. An entry that
// does not start with ownerMark is a name alone (an older server's).
const ownerMark = 0

// ownerEntry encodes an owners entry.
func ownerEntry(owner string, state []byte) []byte {
	b := make([]byte, 0, 1+binary.MaxVarintLen64+len(owner)+len(state))
	b = append(b, ownerMark)
	b = binary.AppendUvarint(b, uint64(len(owner)))
	b = append(b, owner...)
	return append(b, state...)
}

// journalMark starts an owners entry written for a run claimed in its
// journal (claims.go), after its first journal write: the driver's name
// and the run's state as after ownerMark.
const journalMark = 1

// journalEntry encodes the owners entry of a run claimed in its journal.
func journalEntry(owner string, state []byte) []byte {
	b := ownerEntry(owner, state)
	b[0] = journalMark
	return b
}

// claimEntry reports whether an owners entry was written for a run
// claimed in its journal: the run's journal was written before it.
func claimEntry(v []byte) bool { return len(v) > 0 && v[0] == journalMark }

// parseOwnerEntry decodes an owners entry.
//
// Compatibility path, for the entries of servers that wrote a name alone
// (before ownerMark): read as that name, with no state. Every read of an
// owners entry goes through it.
func parseOwnerEntry(v []byte) (owner string, state []byte) {
	if len(v) == 0 || v[0] != ownerMark && v[0] != journalMark {
		return string(v), nil
	}
	n, k := binary.Uvarint(v[1:])
	if k <= 0 || n > uint64(len(v)-1-k) {
		return "", nil
	}
	rest := v[1+k:]
	return string(rest[:n]), rest[n:]
}

// eachEntry calls fn with every current entry of kv whose key matches keys
// (jetstream.AllKeys: every one) until fn returns false.
func eachEntry(ctx context.Context, kv jetstream.KeyValue, keys string, fn func(jetstream.KeyValueEntry) (bool, error)) error {
	w, err := kv.Watch(ctx, keys, jetstream.IgnoreDeletes())
	if err != nil {
		return err
	}
	defer func() { _ = w.Stop() }()
	// nats.go's watcher (jetstream, v1.55) never says it has delivered
	// every current entry when one goes while it delivers them: a purge
	// marker that expires (markerTTL), say. So an entry that says none
	// follow (Delta 0) ends the scan too, and so does eachEntryIdle
	// without news: a scan never waits for good.
	idle := time.NewTimer(eachEntryIdle)
	defer idle.Stop()
	for {
		select {
		case e := <-w.Updates():
			if e == nil {
				return nil // every current entry delivered
			}
			if more, err := fn(e); err != nil || !more {
				return err
			}
			if e.Delta() == 0 {
				return nil // the last of the current entries
			}
			idle.Reset(eachEntryIdle)
		case <-idle.C:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// eachEntryIdle is how long eachEntry waits for the next entry before it
// takes the ones it has for all of them.
const eachEntryIdle = 2 * time.Second

// Beat creates or renews owner's heartbeat, which expires after the lease.
func (s *JetStream) Beat(ctx context.Context, owner string) error {
	sent := time.Now()
	// This server's mark with it (claims.go), when it changed or has not
	// been written for half a lease: the fence of this server's writes,
	// claims included, moves on only once both landed, so a server whose
	// mark was dropped (it was thought dead) writes it again before it
	// claims another run. Written side by side: a beat takes the longer
	// of the two writes, not both.
	mark, due := s.claims.markDue(owner, sent, s.lease/2)
	var markErr error
	var wg sync.WaitGroup
	if due {
		wg.Go(func() {
			_, markErr = s.marks.Put(ctx, owner, strconv.AppendUint(nil, mark, 10))
		})
	}
	_, err := s.beats.Put(ctx, owner, []byte(sent.UTC().Format(time.RFC3339Nano)))
	wg.Wait()
	if err == nil && markErr != nil {
		err = fmt.Errorf("writing this server's mark: %w", markErr)
	}
	if err == nil {
		if due {
			s.claims.markWritten(owner, mark, sent)
		}
		s.beatAt.Store(sent.UnixNano())
	}
	return err
}

// leftBeat is the heartbeat a server leaves behind when it stops (a beat
// is a time).
var leftBeat = []byte("left")

// Alive reports whether owner's heartbeat has not expired, and owner has
// not left.
func (s *JetStream) Alive(ctx context.Context, owner string) (bool, error) {
	e, err := s.beats.Get(ctx, owner)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return false, nil
	case err != nil:
		return false, err
	}
	return !bytes.Equal(e.Value(), leftBeat), nil
}

// Live calls fn with every owner whose heartbeat has not expired.
func (s *JetStream) Live(ctx context.Context, fn func(owner string, left bool)) error {
	return eachEntry(ctx, s.beats, jetstream.AllKeys, func(e jetstream.KeyValueEntry) (bool, error) {
		fn(e.Key(), bytes.Equal(e.Value(), leftBeat))
		return true, nil
	})
}

// Leave replaces owner's heartbeat with one that says it left, which
// expires after the lease like a beat.
func (s *JetStream) Leave(ctx context.Context, owner string) error {
	_, err := s.beats.Put(ctx, owner, leftBeat)
	return err
}

// Claim creates the run's owner key, with its state.
func (s *JetStream) Claim(ctx context.Context, runID, owner string, state []byte) error {
	err := s.createOwner(ctx, runID, ownerEntry(owner, state))
	if errors.Is(err, jetstream.ErrKeyExists) {
		return fmt.Errorf("%w: run %s already has a driver", store.ErrConflict, runID)
	}
	if err == nil {
		s.index.note(runID, state)
	}
	return err
}

// createOwner creates the run's owners entry (write: made again while it
// may pass; a try whose answer was lost counts when the entry is this one).
func (s *JetStream) createOwner(ctx context.Context, runID string, entry []byte) error {
	return s.write(ctx, func(ctx context.Context) error {
		_, err := s.owners.Create(ctx, runID, entry)
		return err
	}, func(ctx context.Context) (bool, error) {
		e, err := s.owners.Get(ctx, runID)
		if err != nil {
			return false, err
		}
		return bytes.Equal(e.Value(), entry), nil
	})
}

// Driver reads the run's owner key, else the claim of its journal until
// it ends (claims.go).
func (s *JetStream) Driver(ctx context.Context, runID string) (string, error) {
	if !validKey(runID) {
		return "", nil
	}
	e, err := s.owners.Get(ctx, runID)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		owner, finished, err := s.claimed(ctx, runID)
		if err != nil || finished {
			return "", err
		}
		return owner, nil
	}
	if err != nil {
		return "", err
	}
	owner, _ := parseOwnerEntry(e.Value())
	return owner, nil
}

// Owners calls fn with every run that has an owners entry. (Runs claimed
// in their journals that have none are found from their servers' marks:
// journalOrphans.)
func (s *JetStream) Owners(ctx context.Context, fn func(runID, owner string) bool) error {
	return eachEntry(ctx, s.owners, jetstream.AllKeys, func(e jetstream.KeyValueEntry) (bool, error) {
		owner, _ := parseOwnerEntry(e.Value())
		return fn(e.Key(), owner), nil
	})
}

// TakeOver swaps the run's owner from from to owner at the revision read,
// so that of several servers trying, exactly one wins. A run claimed in
// its journal by from, without an owners entry, is given one naming
// owner, created only if none exists.
func (s *JetStream) TakeOver(ctx context.Context, runID, from, owner string) error {
	e, err := s.owners.Get(ctx, runID)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		exists, err := s.takeOverClaim(ctx, runID, from, owner)
		if err != nil {
			return err
		}
		if !exists {
			s.claims.forget(runID) // its owners entry names its driver now
			return nil
		}
		// Written meanwhile, by from's claim writer or another server.
		e, err = s.owners.Get(ctx, runID)
	}
	if err != nil {
		return err
	}
	was, state := parseOwnerEntry(e.Value())
	if was != from {
		return fmt.Errorf("%w: run %s is driven by %q", store.ErrConflict, runID, was)
	}
	entry := ownerEntry(owner, state)
	if claimEntry(e.Value()) {
		entry = journalEntry(owner, state)
	}
	if _, err := s.owners.Update(ctx, runID, entry, e.Revision()); err != nil {
		return fmt.Errorf("%w: %v", store.ErrConflict, err)
	}
	s.claims.forget(runID) // its owners entry names its driver now
	return nil
}

// Release deletes the run's owner key; its marker expires after markerTTL
// (0: the janitor purges it after the retention). A run claimed here in
// its journal that has no owners entry has nothing to delete: its
// run_finished is its release.
func (s *JetStream) Release(ctx context.Context, runID string) error {
	if !s.claims.release(runID) {
		return nil
	}
	return s.purgeOwner(ctx, runID)
}

// purgeOwner deletes the run's owner key.
func (s *JetStream) purgeOwner(ctx context.Context, runID string) error {
	return s.write(ctx, func(ctx context.Context) error {
		if s.markerTTL == 0 {
			return s.owners.Purge(ctx, runID)
		}
		return s.owners.Purge(ctx, runID, jetstream.PurgeTTL(s.markerTTL))
	}, nil)
}

// commandReply is the answer to a Command.
type commandReply struct {
	State    []byte `json:"state,omitempty"`
	Error    string `json:"error,omitempty"`
	NotFound bool   `json:"not_found,omitempty"`
	NotReady bool   `json:"not_awaiting,omitempty"`
}

// Serve answers commands sent to owner until stop, once the NATS server
// has the subscription; stop returns once it has the unsubscription.
func (s *JetStream) Serve(ctx context.Context, owner string, handle func(context.Context, *store.Command) (*stubbornv1.ControlState, error)) (func(), error) {
	sub, err := s.nc.Subscribe(commandSubject+owner, func(msg *nats.Msg) {
		go func() {
			var cmd store.Command
			reply := commandReply{}
			if err := json.Unmarshal(msg.Data, &cmd); err != nil {
				reply.Error = err.Error()
			} else {
				hctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				st, err := handle(hctx, &cmd)
				cancel()
				switch {
				case err != nil:
					reply.Error = err.Error()
					reply.NotFound = errors.Is(err, store.ErrNotFound)
					reply.NotReady = errors.Is(err, controls.ErrNotAwaitingDecision)
				default:
					reply.State, _ = proto.Marshal(st)
				}
			}
			data, _ := json.Marshal(reply)
			_ = msg.Respond(data)
		}()
	})
	if err != nil {
		return nil, err
	}
	fctx, cancel := context.WithTimeout(ctx, setupTimeout)
	defer cancel()
	if err := s.nc.FlushWithContext(fctx); err != nil {
		_ = sub.Unsubscribe()
		return nil, err
	}
	return func() {
		// Once the NATS server has the unsubscription: a command sent
		// from then on finds no responder (Send: ErrNotServing) and waits
		// for the run's next driver, rather than going to this connection,
		// unanswered, until the sender's deadline.
		_ = sub.Unsubscribe()
		fctx, cancel := context.WithTimeout(context.Background(), unserveWait)
		defer cancel()
		_ = s.nc.FlushWithContext(fctx)
	}, nil
}

// unserveWait bounds how long the end of Serve waits for the NATS server
// to have the unsubscription (a connection down has none to send).
const unserveWait = 2 * time.Second

// Send asks owner to carry out cmd and waits for its answer.
func (s *JetStream) Send(ctx context.Context, owner string, cmd *store.Command) (*stubbornv1.ControlState, error) {
	data, err := json.Marshal(cmd)
	if err != nil {
		return nil, err
	}
	msg, err := s.nc.RequestWithContext(ctx, commandSubject+owner, data)
	if errors.Is(err, nats.ErrNoResponders) {
		return nil, fmt.Errorf("%w: %v", store.ErrNotServing, err)
	}
	if err != nil {
		return nil, err
	}
	var reply commandReply
	if err := json.Unmarshal(msg.Data, &reply); err != nil {
		return nil, err
	}
	switch {
	case reply.NotFound:
		return nil, fmt.Errorf("%w: %s", store.ErrNotFound, reply.Error)
	case reply.NotReady:
		return nil, fmt.Errorf("%w: %s", controls.ErrNotAwaitingDecision, strings.TrimPrefix(reply.Error, controls.ErrNotAwaitingDecision.Error()))
	case reply.Error != "":
		return nil, errors.New(reply.Error)
	}
	st := &stubbornv1.ControlState{}
	return st, proto.Unmarshal(reply.State, st)
}

// maxKeyBytes bounds a run id used in a subject or a key: far below
// NATS's 4 KiB control line, past which the server closes the connection
// (the API checks run ids first: at most 64 bytes).
const maxKeyBytes = 256

// validKey reports whether s can be a KV key (run ids always can; a
// client's typo may not).
func validKey(s string) bool {
	if s == "" || len(s) > maxKeyBytes {
		return false
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// tenantRuns calls fn with the id and key of every run of tenants, from
// what a cheap look at each stored record of a run says of it (peekListing:
// its tenant and creation time, neither of which ever changes; the rest,
// a result among it, left undecoded). Another tenant's runs are dropped
// as they are read, before anything of them is kept: this is how the
// full view of ListRuns finds a tenant's runs while the index is not
// ready, without holding or decoding every run's state (issue 30).
func (s *JetStream) TenantRuns(ctx context.Context, tenants []string, fn func(runID string, key store.ListKey)) error {
	keys := map[string]store.ListKey{}
	see := func(runID string, state []byte) {
		if id, t, k, ok := peekListing(state); ok && slices.Contains(tenants, t) && id == runID {
			keys[runID] = k
		}
	}
	if err := eachEntry(ctx, s.owners, jetstream.AllKeys, func(e jetstream.KeyValueEntry) (bool, error) {
		_, state := parseOwnerEntry(e.Value())
		see(e.Key(), state)
		return true, nil
	}); err != nil {
		return err
	}
	if err := eachEntry(ctx, s.states, jetstream.AllKeys, func(e jetstream.KeyValueEntry) (bool, error) {
		see(e.Key(), e.Value())
		return true, nil
	}); err != nil {
		return err
	}
	if err := s.lastRawEvents(ctx, func(runID string, last store.Event, err error) {
		if err == nil && last.Finished {
			see(runID, last.StateBytes())
		}
	}); err != nil {
		return err
	}
	for id, k := range keys {
		fn(id, k)
	}
	return nil
}

// claimedRuns calls fn with the id and key of every run of tenants that
// has a driver, from its claim, and of every run this store has yet to
// index (peekListing: nothing of another tenant's
// kept, no claim decoded whole).
func (s *JetStream) ClaimedRuns(ctx context.Context, tenants []string, fn func(runID string, key store.ListKey)) error {
	// And the runs this store has yet to index (a run that ended and let
	// its claim go within indexDelay).
	s.index.mu.Lock()
	for _, m := range []map[string][][]byte{s.index.writing, s.index.pending} {
		for id, q := range m {
			if len(q) > 0 {
				if rid, t, k, ok := peekListing(q[len(q)-1]); ok && slices.Contains(tenants, t) && rid == id {
					fn(id, k)
				}
			}
		}
	}
	s.index.mu.Unlock()
	return eachEntry(ctx, s.owners, jetstream.AllKeys, func(e jetstream.KeyValueEntry) (bool, error) {
		_, state := parseOwnerEntry(e.Value())
		if id, t, k, ok := peekListing(state); ok && slices.Contains(tenants, t) && id == e.Key() {
			fn(id, k)
		}
		return true, nil
	})
}

// peekListing reads a state's run id, tenant and listing key (its
// creation time) without decoding the rest of it; ok is false when those
// do not decode.
func peekListing(data []byte) (runID, tenant string, key store.ListKey, ok bool) {
	var created []byte
	for b := data; len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return "", "", store.ListKey{}, false
		}
		b = b[n:]
		if typ == protowire.BytesType && (num == 1 || num == 12 || num == 16) {
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return "", "", store.ListKey{}, false
			}
			switch num {
			case 1:
				runID = string(v)
			case 12:
				created = v
			case 16:
				tenant = string(v)
			}
			b = b[m:]
			continue
		}
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			return "", "", store.ListKey{}, false
		}
		b = b[m:]
	}
	ts := &timestamppb.Timestamp{}
	if err := proto.Unmarshal(created, ts); err != nil || runID == "" {
		return "", "", store.ListKey{}, false
	}
	return runID, tenant, store.ListKey{Nanos: ts.AsTime().UnixNano(), ID: runID}, true
}
