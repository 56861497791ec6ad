package runs

import (
	"cmp"
	"context"
	"encoding/base64"
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
	var after *listKey
	if pageToken != "" {
		k, err := parseListKey(pageToken)
		if err != nil {
			return nil, "", ErrBadPageToken
		}
		after = &k
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
	slices.SortFunc(all, func(a, b *stubbornv1.ControlState) int { return keyOf(b).compare(keyOf(a)) })
	// A page ends at pageSize runs, or before the run that would take it
	// past MaxListBytes (never before its first): a response a client
	// with gRPC's default 4 MiB limit can read.
	n, size := 0, 0
	for n < len(all) && n < pageSize {
		all[n] = controls.BoundState(all[n], controls.MaxStateBytes)
		size += proto.Size(all[n])
		if n > 0 && size > MaxListBytes {
			break
		}
		n++
	}
	if n == len(all) {
		return all, "", nil
	}
	page := all[:n]
	return page, keyOf(page[len(page)-1]).String(), nil
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
