package runs

// The hooks below let a store's tests (and the fault suite) play the
// faults a process meets — a crash, a stop — and see where runs are.

// PauseHeartbeats freezes the manager's heartbeats and takeover scans, as a
// stopped process would: its runs go on, but others will take them over.
func (m *Manager) PauseHeartbeats() { m.paused.Store(true) }

// ResumeHeartbeats ends PauseHeartbeats, as a process let go on would
// (SIGCONT): it beats and scans again.
func (m *Manager) ResumeHeartbeats() { m.paused.Store(false) }

// Owns reports whether this manager drives the run now.
func (m *Manager) Owns(id string) bool {
	r := m.local(id)
	return r != nil && !r.isLost()
}

// Kill stops driving every run at once, writing nothing and telling no one,
// as a crash would (Manager.kill). The runs are taken over once the lease
// has passed.
func (m *Manager) Kill() { m.kill() }

// Parked returns how many runs wait in backoff without a goroutine (parked
// on park's timer or for a decision).
func (m *Manager) Parked() int { return int(m.parked.Load()) }
