package jsstore

import "time"

// LastBeat returns when the last heartbeat of this store that landed was
// sent (zero before the first): once a lease has gone by since, this
// server counts as dead to the others and its writes are fenced, so a
// health check that says it serves is lying (issue 29, item 6).
func (s *JetStream) LastBeat() time.Time {
	at := s.beatAt.Load()
	if at == 0 {
		return time.Time{}
	}
	return time.Unix(0, at)
}
