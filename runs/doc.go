// Package runs owns a run's life: it starts a control, keeps the journal of
// its events with dense per-run sequence numbers, lets any number of
// watchers replay and follow them, and carries cancellations and decisions
// to the control. The gRPC handlers in package server sit on top of it.
//
// # Locks
//
// The mutexes a run goes through, and what each guards:
//
//   - controls.Tracker's mu (package controls): the run's state. The
//     tracker calls back with it held: the recorder (run.record), the
//     OnLive functions (the release of holdCancel, run.wentLive,
//     run.setTracker), the park hook of ParkWaits (which flushes and calls
//     Manager.park) and Answer's taken.
//   - run.flushMu: one flush of a run at a time, in order (run.flush); held
//     across the flush's store writes.
//   - run.mu: the rest of a run: its journal in memory, the events and state
//     pending a write, its tracker, parking and replay, done and lost. The
//     Observer's function is called with it held (record, loseLocked).
//   - parking.mu: a parked run's wake-up (woken, timer, stop).
//   - the mu of holdCancel: whether a held-back cancellation was released.
//   - Manager.mu: the local runs (runs, finished, counter, closed).
//   - JetStream.mu (last), janitor.mu (used, usedAt, reading, starved),
//     Memory.mu (all of Memory), workers.mu, connWatch.mu, natsLogger.mu:
//     their own fields.
//
// A lock may be taken while one above it on its path here is held, never
// the other way round:
//
//	controls.Tracker's mu
//	├── run.flushMu          (record, the park hook: flush)
//	│   ├── run.mu
//	│   │   └── the Observer's own locks
//	│   └── the store's locks (JetStream.mu, janitor.mu, Memory.mu)
//	├── run.mu               (record, wentLive, setTracker)
//	├── parking.mu           (the park hook: Manager.park)
//	└── the mu of holdCancel (its release, an OnLive function)
//
// run.mu and parking.mu are never held together: park, wake and decide
// take one after the other. No lock of this package is held while the
// tracker is called: snapshot, live and handle read run.tracker under
// run.mu and call it after unlocking. Manager.mu, workers.mu and the
// store's locks are leaves: nothing is taken under them, and they are never
// held across a store call or a callback (Memory, JetStream.States and
// Owners call fn unlocked). connWatch.mu is held while it calls its report
// function, which must not call back into the watch.
//
// # Store I/O
//
// No store call is made under Manager.mu, run.mu, parking.mu or a store's
// own lock. The writes of a run's journal and state (Append and PutState in
// run.flush and run.endRefused) are made under run.flushMu, by design:
// a run's writes go one at a time, in order. When the flush comes from
// run.record (an event that must be durable at once: a wait, a decision,
// the run's end, an event while a call is in flight) or from the park hook,
// they are also made under controls.Tracker's mu. A JetStream write that
// fails is made again for up to WriteRetry (the lease, 10 s by default),
// and meanwhile GetRun and DecideRun on that run (Tracker.Snapshot,
// Tracker.Decide) and the run's other branches (a race's candidates) wait
// for the tracker. Moving those writes out of the tracker's lock (an outbox
// written by the run's goroutine after unlocking) is item 3 of issue 18,
// still to be done. Every other store call (claims, heartbeats, takeover
// scans and resumes, unstart, retire, commands, Get, List, Watch) is made
// with no lock of this package held.
package runs
