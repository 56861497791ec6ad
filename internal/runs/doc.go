// Package runs owns a run's life: it starts a control, keeps the journal of
// its events with dense per-run sequence numbers, lets any number of
// watchers replay and follow them, and carries cancellations and decisions
// to the control. The gRPC handlers in package server sit on top of it.
//
// # How a run ends here
//
// One word for each way a run stops being driven by this server, used in
// the code and the logs alike:
//
//   - finish: the control ended and run_finished is written (drive); the
//     claim is then released (retire).
//   - fail at start (unstart): run_started could not be recorded; the
//     saved state says FAILED and the claim is released.
//   - refuse (endRefused): the store refused the run's events for good;
//     a small run_finished says FAILED.
//   - unrecoverable: a run taken over whose journal is damaged or lost
//     ends FAILED without being driven.
//   - lose: a write failed or lost to another server's (a conflict); the
//     run is left to whoever drives it now, writing nothing more.
//   - abandon: this server stops (Close, kill) and leaves the run to be
//     taken over.
//   - forget: the run was never accepted (its claim failed, or the
//     manager is closed).
//
// Parking is not an end: park, wake and unpark put a waiting run aside and
// drive it again; endDrive is the bookkeeping of every drive's end.
//
// # Locks
//
// A run is made of parts (run.go), each guarded by a lock named here:
// runSetup (fixed when the run is admitted: no lock), runLife and feed
// (run.mu), the outbox (its pending events under run.mu, this copy's part
// in the journal's writes — store.Writer, the status saved — under
// run.flushMu) and runParking (run.waitMu, and run.mu for its fields).
//
// The mutexes a run goes through, and what each guards:
//
//   - controls.Tracker's mu (package controls): the run's state. The
//     tracker calls back with it held: the recorder (run.record, which
//     only queues the event: the outbox, and on a replay's first live
//     event calls the release of holdCancel). Its waits (runClock.Sleep,
//     which may evict the run) are made with it unlocked.
//   - run.waitMu: orders a run's parking (run.evict) and a decision taken
//     while it waits (handle): held across the tracker's Decide.
//   - run.flushMu: one flush of a run at a time, in order (run.flush); held
//     across the flush's store writes; guards the outbox's writer part
//     (jw, savedStatus, saveEnd).
//   - run.mu: the rest of a run: runLife (its tracker, replay, done and
//     lost), the feed (its journal in memory, its watchers' wake-up), the
//     outbox's pending events and state, and the parking's fields. The
//     Observer's function is called with it held (record, loseLocked).
//   - parking.mu: a parked run's wake-up (woken, timer, stop).
//   - the mu of holdCancel: whether a held-back cancellation was released.
//   - Manager.mu: the local runs (runs, finished, counter, closed).
//   - JetStream.mu (last), janitor.mu (used, usedAt, reading, starved),
//     claims.mu (the runs claimed in their journals, the marks written:
//     claims.go; all in runs/jsstore), Memory.mu (all of Memory but its
//     feed) and the Memory feed's mu (its followers; runs/memstore),
//     workers.mu, connWatch.mu, natsLogger.mu: their own fields.
//
// A lock may be taken while one above it on its path here is held, never
// the other way round:
//
//	run.waitMu               (evict, handle)
//	└── controls.Tracker's mu
//	    ├── run.mu               (record, evict, wentLive)
//	    │   └── the Observer's own locks
//	    └── the mu of holdCancel (its release, from record or wentLive)
//
//	run.flushMu             (flush; never under the tracker's mu)
//	├── run.mu
//	│   └── the Observer's own locks
//	└── the store's locks (JetStream.mu, janitor.mu, claims.mu, Memory.mu)
//
// run.mu and parking.mu are never held together: park, wake and decide
// take one after the other. No lock of this package is held while the
// tracker is called, but run.waitMu across handle's Decide: snapshot,
// live and handle read run.tracker under run.mu and call it after
// unlocking. Manager.mu, workers.mu and the
// store's locks are leaves: nothing is taken under them (but the Memory
// feed's mu, under Memory.mu, to queue a change for its followers), and
// they are never held across a store call or a callback (Memory,
// JetStream.States and Owners call fn unlocked). connWatch.mu is held while it calls its report
// function, which must not call back into the watch.
//
// # Store I/O
//
// No store call is made under a lock that guards data: not under the
// tracker's mu, Manager.mu, run.mu, parking.mu or a store's own lock. The
// tracker's recorder (run.record) only numbers, encodes and queues each
// event in the run's outbox (outbox.pending); the outbox is written by
// run.flush, one flush at a time under run.flushMu (the writer's turn, not
// a data lock: readers of the run never take it), from the run's own
// goroutines once the tracker is unlocked: before each delegate call and
// health check (flushing), before a wait (runClock), after the
// control parks or ends (drive), once a decision is taken (handle,
// decide), before a woken run is replayed (unpark), and by the run's
// writer (kick) for an event nobody else waits to write: a request for a
// decision, news of a race's candidate while another call is in flight.
// A JetStream write that fails is made again for up to WriteRetry, and
// meanwhile only that run's own steps wait: GetRun and DecideRun read the
// tracker, which no write holds. Every other store call (claims,
// heartbeats, takeover scans and resumes, unstart, retire, commands, Get,
// List, Watch) is made with no lock of this package held.
package runs
