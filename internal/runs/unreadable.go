package runs

import (
	"context"
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// One unreadable run costs only that run (issue 30): a run whose stored
// state or journal cannot be decoded — a record damaged on disk, written
// by a buggy release, or holding data nested past protobuf's recursion
// limit (a delegate's answer before controls.MaxDataDepth) — is left out
// of every listing with an ERROR naming it, GetRun of it is ErrUnreadable,
// and Delete removes it without decoding it.

// Fields of ControlState that may nest deeply (a result's data, the spec):
// what peekState leaves out.
var deepStateFields = map[protowire.Number]bool{
	3: true, // result
	6: true, // failure_history
	7: true, // attempt_log
	9: true, // control
}

// peekState decodes what it can of a state that does not decode whole:
// its top-level fields but the deep ones (its run id, status, tenant,
// options, times). ok is false when even those do not decode.
func peekState(data []byte) (*stubbornv1.ControlState, bool) {
	var shallow []byte
	for b := data; len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, false
		}
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if m < 0 {
			return nil, false
		}
		if !deepStateFields[num] {
			shallow = append(shallow, b[:n+m]...)
		}
		b = b[n+m:]
	}
	st := &stubbornv1.ControlState{}
	if err := proto.Unmarshal(shallow, st); err != nil {
		return nil, false
	}
	return st, true
}

// deleteUnreadable deletes run id, whose stored records do not decode
// (readErr): it is treated as finished (no driver can make progress with
// a state no one can read; its tombstone keeps it from being resumed). Its
// tenant is read from what decodes of its state or, failing that, from
// its summary in the index; a run that names no tenant anywhere may be
// deleted by any caller that names it: nothing of it can be read by
// anyone.
func (m *Manager) deleteUnreadable(ctx context.Context, id string, readErr error) error {
	raw, tenant, known, err := m.store.RawState(ctx, id)
	if err != nil {
		return err
	}
	key := ""
	if st, ok := peekState(raw); ok && st.GetRunId() == id {
		tenant, known, key = st.GetTenant(), true, st.GetOptions().GetIdempotencyKey()
	}
	if known {
		if err := visible(ctx, id, tenant); err != nil {
			return err
		}
	}
	m.log.Error("deleting a run whose stored records cannot be read", "run_id", id, "tenant_known", known, "err", readErr)
	var kerr error
	switch {
	case key != "" && key != id:
		kerr = m.store.ForgetKey(ctx, keyHash(tenant, key), id)
	case key == "":
		// Its options do not decode: any key that names it goes.
		kerr = m.store.ForgetKeysOf(ctx, id)
	}
	if kerr != nil {
		return fmt.Errorf("deleting run %s: its idempotency key: %w", id, kerr)
	}
	if err := m.store.DeleteRun(ctx, id); err != nil {
		return fmt.Errorf("deleting run %s: %w", id, err)
	}
	m.forgetUnreadable(id)
	return nil
}

// forgetUnreadable drops run id from this server's memory, finished or not
// (a copy that could not read its own records drives nothing).
func (m *Manager) forgetUnreadable(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.runs, id)
}
