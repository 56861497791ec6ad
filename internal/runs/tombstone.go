package runs

import (
	"fmt"
)

// Deletion that a crash cannot undo (issue 29). DeleteRun writes a
// tombstone first, and acknowledges it only once it is stored (on every
// replica the store has), then purges the run's records. A crash anywhere
// after the tombstone cannot bring the run back to life:
//
//   - a server that takes a run over asks first whether it was deleted
//     (Manager.deleted, called at the top of resume): a deleted run is never
//     resumed, what is left of it is purged again, and its claim goes;
//   - a JetStream store that opens purges again what is left of every run
//     its tombstones name (redoDeletes): a purge cut short by the crash, or
//     one that the NATS server's recovery undid. (nats-server 2.15.2 brings
//     back, after a SIGKILL, the owner entries that a rollup and a purge had
//     removed from the owners bucket — the bucket whose release markers
//     carry a per-message TTL — while one of those markers is pending: the
//     runs came back claimed, with neither journal nor state, and were
//     resumed from their claims.)
//
// A crash before the tombstone is stored leaves the run whole: DeleteRun
// did not answer OK, and the run was cancelled first if it was in flight,
// so nothing resumes it either.
//
// Tombstones are bounded: the JetStream bucket's TTL is the retention
// (every record of a deleted run is gone long before), and a Memory store
// keeps the last memoryTombstones.

// deleted reports whether run id was deleted, and if so purges what is
// left of it (its claim included), so that resume leaves it alone: called
// first thing in resume. An error (the tombstone could not be read) leaves
// the run claimed, not resumed, for the next scan.
func (m *Manager) deleted(id string) (bool, error) {
	gone, err := m.store.DeletedRun(m.ctx, id)
	if err != nil {
		return true, fmt.Errorf("run %s: reading whether it was deleted: %w", id, err)
	}
	if !gone {
		return false, nil
	}
	m.log.Info("not resuming a deleted run: what was left of it is purged", "run_id", id)
	if err := m.store.DeleteRun(m.ctx, id); err != nil {
		return true, fmt.Errorf("run %s was deleted: purging what is left of it: %w", id, err)
	}
	return true, nil
}
