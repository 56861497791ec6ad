package server

// PendingMalformed counts the requests s's codec could not decode that no
// interceptor has answered yet.
func PendingMalformed(s *Stubborn) int { return s.svc.malformed.pending() }

// CheckPlaintextListenWith is CheckPlaintextListen resolving names with
// lookup.
var CheckPlaintextListenWith = checkPlaintextListen

// RegistriesClosed counts the registries s let go of: replaced by a
// reload, their last run ended.
func RegistriesClosed(s *Stubborn) int {
	s.svc.regs.mu.Lock()
	defer s.svc.regs.mu.Unlock()
	return s.svc.regs.closed
}
