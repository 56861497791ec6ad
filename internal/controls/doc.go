// Package controls holds Stubborn's resilience controls — retry,
// retry-with-learning, fallback-chain and race — as pure Go algorithms.
//
// A control sees the world through [Env]: it calls delegates by name, sleeps
// on a [Clock], draws jitter from an injected random source and reports every
// step to a [Tracker], which keeps the run's ControlState and emits its
// events. Nothing here knows about gRPC servers or storage, so every control
// is tested with a fake clock and fake delegates in milliseconds.
package controls
