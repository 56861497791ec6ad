// Package runs owns a run's life: it starts a control, keeps the journal of
// its events with dense per-run sequence numbers, lets any number of
// watchers replay and follow them, and carries cancellations and decisions
// to the control. The gRPC handlers in package server sit on top of it.
package runs
