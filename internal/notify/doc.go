// Package notify tells people when a run waits for them: it posts signed
// notices (webhooks) to the notify targets a tenant, a preset or the
// config lists, and serves the one-time decision links the notices carry.
//
// Off every run's path: the runs' Observer hands each event it wants to an
// in-memory inbox and returns; a goroutine turns it into one record a
// target in a Queue (a JetStream KV bucket shared by the replicas, or a
// map in process), and a delivery loop posts the due ones, each claimed by
// one replica at a time with a lease (compare-and-set), until a 2xx or
// for MaxAge, with full-jitter backoff.
package notify
