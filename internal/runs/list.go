package runs

import (
	"context"
	"errors"
	"slices"

	"google.golang.org/protobuf/proto"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/internal/controls"
	"github.com/stubbornhq/stubborn/internal/runs/store"
)

// List returns ctx's tenant's runs newest first, filtered by status when it
// is not UNSPECIFIED, pageSize at most, and the token of the next page (""
// when this is the last).
func (m *Manager) List(ctx context.Context, status stubbornv1.RunStatus, pageSize int, pageToken string) ([]*stubbornv1.ControlState, string, error) {
	return m.ListWhere(ctx, Filter{Status: status}, pageSize, pageToken)
}

// ListWhere is List with every filter.
//
// A listing costs in proportion to what it returns (issue 30): with a
// store that indexes the runs (JetStream), the tenant's run ids come from
// its summaries in the index, and only the page's runs' states are read,
// one at a time (State). Until the index is ready, the JetStream store
// lists the tenant's run ids from what a cheap look at each stored state
// says of it (its tenant and creation time, the result left undecoded),
// and the page's states are read the same way. Any other store (Memory)
// streams its states, another tenant's dropped at once, and keeps at most
// a page. No step holds more than a page of states.
func (m *Manager) ListWhere(ctx context.Context, f Filter, pageSize int, pageToken string) ([]*stubbornv1.ControlState, string, error) {
	after, err := pageAfter(pageToken)
	if err != nil {
		return nil, "", err
	}
	tenants := Owners(ctx)
	if page, next, ok, err := m.listIndexed(ctx, f, tenants, after, pageSize); ok || err != nil {
		return page, next, err
	}
	keys := map[string]store.ListKey{}
	switch err := m.store.TenantRuns(ctx, tenants, func(id string, k store.ListKey) { keys[id] = k }); {
	case errors.Is(err, store.ErrNoIndex):
		return m.listScanning(ctx, f, after, pageSize)
	case err != nil:
		return nil, "", err
	}
	for _, id := range m.localIDs(tenants) {
		if r := m.local(id); r != nil && !r.isLost() {
			if cur, err := r.snapshot(); err == nil {
				keys[id] = store.KeyOf(cur)
			}
		}
	}
	return m.pageOfStates(ctx, candidates(keys, after), f, after, pageSize)
}

// listIndexed is ListWhere from the store's index; ok false when the
// store has none, or none ready.
func (m *Manager) listIndexed(ctx context.Context, f Filter, tenants []string, after *store.ListKey, pageSize int) (page []*stubbornv1.ControlState, next string, ok bool, err error) {
	// The runs in flight on other servers, and those this store is
	// indexing, that the index may not have yet (it lags by
	// indexDelay and a write): looked at before the index is read, so
	// that a run whose index entry is written meanwhile is in one or
	// the other (read after, a run that left the queue and its claim
	// between the two reads was in neither).
	claimed := map[string]store.ListKey{}
	err = m.store.ClaimedRuns(ctx, tenants, func(id string, k store.ListKey) { claimed[id] = k })
	if err != nil && !errors.Is(err, store.ErrNoIndex) {
		return nil, "", false, err
	}
	byID, ok, err := m.indexedSummaries(ctx, tenants)
	if err != nil {
		return nil, "", false, err
	}
	if ok {
		keys := map[string]store.ListKey{}
		for id, sum := range byID {
			// A summary not finished may be behind its run: its status
			// is checked on the state read.
			g := f
			if !store.IsTerminal(sum.GetStatus()) {
				g.Status = stubbornv1.RunStatus_RUN_STATUS_UNSPECIFIED
			}
			if g.MatchesSummary(sum) {
				keys[id] = summaryKey(sum)
			}
		}
		for id, k := range claimed {
			if _, ok := byID[id]; !ok {
				keys[id] = k
			}
		}
		page, next, err := m.pageOfStates(ctx, candidates(keys, after), f, after, pageSize)
		return page, next, true, err
	}
	return nil, "", false, nil
}

// listCandidate is a run that may be on a page: its id and its key.
type listCandidate struct {
	id  string
	key store.ListKey
}

// candidates are the runs of keys after after.
func candidates(keys map[string]store.ListKey, after *store.ListKey) []listCandidate {
	cands := make([]listCandidate, 0, len(keys))
	for id, k := range keys {
		if after == nil || after.Before(k) {
			cands = append(cands, listCandidate{id, k})
		}
	}
	return cands
}

// pageOfStates sorts cands newest first and reads their states one at a
// time, the fresher copy of the runs driven here, until the page is full:
// pageSize runs, or the one that would take it past maxListBytes (never
// before the first). A run gone meanwhile, unreadable (logged), or no
// longer passing f is left out. The token is the last run's key when
// candidates remain.
func (m *Manager) pageOfStates(ctx context.Context, cands []listCandidate, f Filter, after *store.ListKey, pageSize int) ([]*stubbornv1.ControlState, string, error) {
	slices.SortFunc(cands, func(a, b listCandidate) int { return b.key.Compare(a.key) })
	var page []*stubbornv1.ControlState
	size := 0
	for _, c := range cands {
		if len(page) == pageSize {
			return page, store.KeyOf(page[len(page)-1]).String(), nil
		}
		st, err := m.listedState(ctx, c.id)
		switch {
		case errors.Is(err, ErrNotFound):
			continue // deleted meanwhile
		case errors.Is(err, ErrUnreadable):
			m.log.Error("listing: a run whose stored records cannot be read is left out (DeleteRun removes it)", "run_id", c.id, "err", err)
			continue
		case err != nil:
			return nil, "", err
		}
		if !owns(ctx, st.GetTenant()) || !f.matches(st) || (after != nil && !after.Before(store.KeyOf(st))) {
			continue
		}
		st = controls.BoundState(st, controls.MaxStateBytes)
		if size += proto.Size(st); len(page) > 0 && size > maxListBytes {
			return page, store.KeyOf(page[len(page)-1]).String(), nil
		}
		page = append(page, st)
	}
	return page, "", nil
}

// listedState is a run's state for a listing: the fresher copy of a run
// driven here, else the stored one.
func (m *Manager) listedState(ctx context.Context, id string) (*stubbornv1.ControlState, error) {
	if r := m.local(id); r != nil && !r.isLost() {
		if cur, err := r.snapshot(); err == nil {
			return cur, nil
		}
	}
	return m.store.State(ctx, id)
}

// listScanning is ListWhere over a store that indexes nothing (Memory):
// its states streamed, another tenant's dropped before anything is kept,
// and at most the best pageSize kept.
func (m *Manager) listScanning(ctx context.Context, f Filter, after *store.ListKey, pageSize int) ([]*stubbornv1.ControlState, string, error) {
	var kept []*stubbornv1.ControlState // newest first, at most pageSize
	more := false
	if err := m.store.States(ctx, func(st *stubbornv1.ControlState) bool {
		if !owns(ctx, st.GetTenant()) {
			return true // another tenant's: not there, as far as ctx can tell
		}
		if r := m.local(st.GetRunId()); r != nil && !r.isLost() {
			if cur, err := r.snapshot(); err == nil {
				st = cur // fresher than the stored one
			}
		}
		if !f.matches(st) {
			return true
		}
		k := store.KeyOf(st)
		if after != nil && !after.Before(k) {
			return true
		}
		i, _ := slices.BinarySearchFunc(kept, k, func(e *stubbornv1.ControlState, k store.ListKey) int { return k.Compare(store.KeyOf(e)) })
		if i == pageSize {
			more = true // older than every run kept, which fill the page
			return true
		}
		kept = slices.Insert(kept, i, controls.BoundState(st, controls.MaxStateBytes))
		if len(kept) > pageSize {
			kept, more = kept[:pageSize], true
		}
		return true
	}); err != nil {
		return nil, "", err
	}
	n, size := 0, 0
	for n < len(kept) {
		if size += proto.Size(kept[n]); n > 0 && size > maxListBytes {
			break
		}
		n++
	}
	if n == len(kept) && !more {
		return kept, "", nil
	}
	page := kept[:n]
	if len(page) == 0 {
		return page, "", nil
	}
	return page, store.KeyOf(page[len(page)-1]).String(), nil
}

// paged sorts all newest first and returns its first page and the token
// of the next ("" when this is the last). A page ends at pageSize runs, or
// before the run that would take it past maxListBytes (never before its
// first): a response a client with gRPC's default 4 MiB limit can read.
// bound bounds each run of the page as it is sent.
func paged[T proto.Message](all []T, key func(T) store.ListKey, bound func(T) T, pageSize int) ([]T, string) {
	slices.SortFunc(all, func(a, b T) int { return key(b).Compare(key(a)) })
	n, size := 0, 0
	for n < len(all) && n < pageSize {
		all[n] = bound(all[n])
		size += proto.Size(all[n])
		if n > 0 && size > maxListBytes {
			break
		}
		n++
	}
	if n == len(all) {
		return all, ""
	}
	page := all[:n]
	return page, key(page[len(page)-1]).String()
}

// ListSummaries is ListWhere's runs as summaries (Summary). With a store
// that indexes them (JetStream) it reads ctx's tenant's summaries only,
// not every run's state; the runs this server drives are as fresh as
// their drivers know them.
func (m *Manager) ListSummaries(ctx context.Context, f Filter, pageSize int, pageToken string) ([]*stubbornv1.RunSummary, string, error) {
	after, err := pageAfter(pageToken)
	if err != nil {
		return nil, "", err
	}
	byID, ok, err := m.indexedSummaries(ctx, Owners(ctx))
	if err != nil {
		return nil, "", err
	}
	if !ok {
		return m.summariesOfStates(ctx, f, pageSize, pageToken)
	}
	all := make([]*stubbornv1.RunSummary, 0, len(byID))
	for _, sum := range byID {
		if f.MatchesSummary(sum) && (after == nil || after.Before(summaryKey(sum))) {
			all = append(all, sum)
		}
	}
	page, next := paged(all, summaryKey, func(s *stubbornv1.RunSummary) *stubbornv1.RunSummary { return s }, pageSize)
	return page, next, nil
}

// indexedSummaries returns the summaries of tenants' runs by id, from
// the index, the runs driven here that the index may have behind (not
// finished there: a finished run's summary is its last) as fresh as their
// drivers know them. ok false: the index is not ready.
func (m *Manager) indexedSummaries(ctx context.Context, tenants []string) (map[string]*stubbornv1.RunSummary, bool, error) {
	byID := map[string]*stubbornv1.RunSummary{}
	for _, tenant := range tenants {
		ok, err := m.store.Summaries(ctx, tenant, func(sum *stubbornv1.RunSummary) bool {
			byID[sum.GetRunId()] = sum
			return true
		})
		if err != nil || !ok {
			return nil, ok, err
		}
	}
	for _, id := range m.localIDs(tenants) {
		if sum, ok := byID[id]; ok && store.IsTerminal(sum.GetStatus()) {
			continue
		}
		r := m.local(id)
		if r == nil || r.isLost() {
			continue
		}
		cur, err := r.snapshot()
		if err != nil {
			continue
		}
		if _, indexed := byID[id]; !indexed && r.isDone() && m.deletedElsewhere(ctx, id) {
			continue
		}
		byID[id] = store.Summary(cur)
	}
	return byID, true, nil
}

// deletedElsewhere reports whether finished run id, driven here and gone
// from the index, was deleted by another server whose news of it
// (OnForget) has not come yet; it forgets the run here if so.
func (m *Manager) deletedElsewhere(ctx context.Context, id string) bool {
	deleted, err := m.store.DeletedRun(ctx, id)
	if err != nil || !deleted {
		return false
	}
	m.forgetFinished(id)
	return true
}

// summariesOfStates is ListSummaries from the runs' states.
func (m *Manager) summariesOfStates(ctx context.Context, f Filter, pageSize int, pageToken string) ([]*stubbornv1.RunSummary, string, error) {
	list, next, err := m.ListWhere(ctx, f, pageSize, pageToken)
	if err != nil {
		return nil, "", err
	}
	sums := make([]*stubbornv1.RunSummary, len(list))
	for i, st := range list {
		sums[i] = store.Summary(st)
	}
	return sums, next, nil
}

// FollowSummaries calls fn with nil and "" once it follows, then with the
// summary of each of ctx's tenant's runs as it starts and changes status,
// or with the id of one deleted (after any summary of it), on every
// server that shares the store, until ctx ends or fn fails (the store's
// FollowSummaries).
func (m *Manager) FollowSummaries(ctx context.Context, fn func(sum *stubbornv1.RunSummary, deleted string) error) error {
	return m.store.FollowSummaries(ctx, Owners(ctx), fn)
}

// localIDs returns the ids of tenants' runs that this server drives or
// drove.
func (m *Manager) localIDs(tenants []string) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var ids []string
	for id, r := range m.runs {
		if slices.Contains(tenants, r.tenant) {
			ids = append(ids, id)
		}
	}
	return ids
}

func summaryKey(s *stubbornv1.RunSummary) store.ListKey {
	return store.ListKey{Nanos: s.GetCreateTime().AsTime().UnixNano(), ID: s.GetRunId()}
}

// pageAfter is the run a page token says the page starts after (nil for
// the first page), or ErrBadPageToken.
func pageAfter(token string) (*store.ListKey, error) {
	if token == "" {
		return nil, nil
	}
	k, err := store.ParseListKey(token)
	if err != nil {
		return nil, ErrBadPageToken
	}
	return &k, nil
}

// maxListBytes bounds the states of one page of List: below gRPC's
// default 4 MiB message limit, with room for one run of the largest state
// (controls.MaxStateBytes and an accepted result of max_result_bytes).
const maxListBytes = 3 << 20
