package runs

import (
	"cmp"
	"context"
	"encoding/base64"
	"errors"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"

	"github.com/stubbornhq/stubborn/controls"
	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

func isTerminal(s stubbornv1.RunStatus) bool {
	switch s {
	case stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED, stubbornv1.RunStatus_RUN_STATUS_EXHAUSTED,
		stubbornv1.RunStatus_RUN_STATUS_FAILED, stubbornv1.RunStatus_RUN_STATUS_CANCELLED:
		return true
	}
	return false
}

// List returns ctx's tenant's runs newest first, filtered by status when it
// is not UNSPECIFIED, pageSize at most, and the token of the next page (""
// when this is the last).
func (m *Manager) List(ctx context.Context, status stubbornv1.RunStatus, pageSize int, pageToken string) ([]*stubbornv1.ControlState, string, error) {
	return m.ListWhere(ctx, Filter{Status: status}, pageSize, pageToken)
}

// ListWhere is List with every filter.
func (m *Manager) ListWhere(ctx context.Context, f Filter, pageSize int, pageToken string) ([]*stubbornv1.ControlState, string, error) {
	after, err := pageAfter(pageToken)
	if err != nil {
		return nil, "", err
	}
	tenant := TenantFrom(ctx)
	var all []*stubbornv1.ControlState
	if err := m.store.States(ctx, func(st *stubbornv1.ControlState) bool {
		if st.GetTenant() != tenant {
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
		if after != nil && !after.before(keyOf(st)) {
			return true
		}
		all = append(all, st)
		return true
	}); err != nil {
		return nil, "", err
	}
	page, next := paged(all, keyOf, func(st *stubbornv1.ControlState) *stubbornv1.ControlState {
		return controls.BoundState(st, controls.MaxStateBytes)
	}, pageSize)
	return page, next, nil
}

// paged sorts all newest first and returns its first page and the token
// of the next ("" when this is the last). A page ends at pageSize runs, or
// before the run that would take it past MaxListBytes (never before its
// first): a response a client with gRPC's default 4 MiB limit can read.
// bound bounds each run of the page as it is sent.
func paged[T proto.Message](all []T, key func(T) listKey, bound func(T) T, pageSize int) ([]T, string) {
	slices.SortFunc(all, func(a, b T) int { return key(b).compare(key(a)) })
	n, size := 0, 0
	for n < len(all) && n < pageSize {
		all[n] = bound(all[n])
		size += proto.Size(all[n])
		if n > 0 && size > MaxListBytes {
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

// summaryIndex is a store that keeps the runs' summaries by tenant: the
// JetStream store's listing index (index.go).
type summaryIndex interface {
	// Summaries calls fn with the summary of each of tenant's runs; ok
	// false says the index is not to be trusted yet.
	Summaries(ctx context.Context, tenant string, fn func(*stubbornv1.RunSummary) bool) (ok bool, err error)
	// FollowSummaries calls fn with nil once it follows, then with each
	// of tenant's runs' summaries as they change, until ctx ends or fn
	// fails.
	FollowSummaries(ctx context.Context, tenant string, fn func(*stubbornv1.RunSummary) error) error
}

// ListSummaries is ListWhere's runs as summaries (Summary). With a store
// that indexes them (JetStream) it reads ctx's tenant's summaries only,
// not every run's state; the runs this server drives are as fresh as
// their drivers know them.
func (m *Manager) ListSummaries(ctx context.Context, f Filter, pageSize int, pageToken string) ([]*stubbornv1.RunSummary, string, error) {
	idx, ok := m.store.(summaryIndex)
	if !ok {
		return m.summariesOfStates(ctx, f, pageSize, pageToken)
	}
	after, err := pageAfter(pageToken)
	if err != nil {
		return nil, "", err
	}
	tenant := TenantFrom(ctx)
	byID := map[string]*stubbornv1.RunSummary{}
	ok, err = idx.Summaries(ctx, tenant, func(sum *stubbornv1.RunSummary) bool {
		byID[sum.GetRunId()] = sum
		return true
	})
	if err != nil {
		return nil, "", err
	}
	if !ok {
		return m.summariesOfStates(ctx, f, pageSize, pageToken)
	}
	// The runs driven here that the index may have behind: not finished
	// there (a finished run's summary is its last).
	for _, id := range m.localIDs(tenant) {
		if sum, ok := byID[id]; ok && isTerminal(sum.GetStatus()) {
			continue
		}
		if r := m.local(id); r != nil && !r.isLost() {
			if cur, err := r.snapshot(); err == nil {
				byID[id] = Summary(cur)
			}
		}
	}
	all := make([]*stubbornv1.RunSummary, 0, len(byID))
	for _, sum := range byID {
		if f.MatchesSummary(sum) && (after == nil || after.before(summaryKey(sum))) {
			all = append(all, sum)
		}
	}
	page, next := paged(all, summaryKey, func(s *stubbornv1.RunSummary) *stubbornv1.RunSummary { return s }, pageSize)
	return page, next, nil
}

// summariesOfStates is ListSummaries from the runs' states.
func (m *Manager) summariesOfStates(ctx context.Context, f Filter, pageSize int, pageToken string) ([]*stubbornv1.RunSummary, string, error) {
	list, next, err := m.ListWhere(ctx, f, pageSize, pageToken)
	if err != nil {
		return nil, "", err
	}
	sums := make([]*stubbornv1.RunSummary, len(list))
	for i, st := range list {
		sums[i] = Summary(st)
	}
	return sums, next, nil
}

// FollowSummaries calls fn with nil once it follows, then with the
// summary of each of ctx's tenant's runs as it starts and changes status,
// on every server that shares the store, until ctx ends or fn fails. It returns ErrNoIndex at once when the store
// keeps no index (the memory store: follow the runs driven here instead).
func (m *Manager) FollowSummaries(ctx context.Context, fn func(*stubbornv1.RunSummary) error) error {
	idx, ok := m.store.(summaryIndex)
	if !ok {
		return ErrNoIndex
	}
	return idx.FollowSummaries(ctx, TenantFrom(ctx), fn)
}

// ErrNoIndex: the store keeps no index of the runs' summaries.
var ErrNoIndex = errors.New("the run store keeps no index of runs")

// localIDs returns the ids of tenant's runs that this server drives or
// drove.
func (m *Manager) localIDs(tenant string) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var ids []string
	for id, r := range m.runs {
		if r.tenant == tenant {
			ids = append(ids, id)
		}
	}
	return ids
}

func summaryKey(s *stubbornv1.RunSummary) listKey {
	return listKey{s.GetCreateTime().AsTime().UnixNano(), s.GetRunId()}
}

// MaxListBytes bounds the states of one page of List: below gRPC's
// default 4 MiB message limit, with room for one run of the largest state
// (controls.MaxStateBytes and an accepted result of max_result_bytes).
const MaxListBytes = 3 << 20

// listKey orders runs for ListRuns: by creation time, then id.
type listKey struct {
	nanos int64
	id    string
}

func keyOf(st *stubbornv1.ControlState) listKey {
	return listKey{st.GetCreateTime().AsTime().UnixNano(), st.GetRunId()}
}

func (k listKey) compare(o listKey) int {
	if c := cmp.Compare(k.nanos, o.nanos); c != 0 {
		return c
	}
	return strings.Compare(k.id, o.id)
}

// before reports whether o comes after k in newest-first order.
func (k listKey) before(o listKey) bool { return o.compare(k) < 0 }

func (k listKey) String() string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(k.nanos, 10) + "/" + k.id))
}

// pageAfter is the run a page token says the page starts after (nil for
// the first page), or ErrBadPageToken.
func pageAfter(token string) (*listKey, error) {
	if token == "" {
		return nil, nil
	}
	k, err := parseListKey(token)
	if err != nil {
		return nil, ErrBadPageToken
	}
	return &k, nil
}

func parseListKey(s string) (listKey, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return listKey{}, err
	}
	nanos, id, ok := strings.Cut(string(b), "/")
	if !ok || id == "" {
		return listKey{}, ErrBadPageToken
	}
	n, err := strconv.ParseInt(nanos, 10, 64)
	return listKey{n, id}, err
}
