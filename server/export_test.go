package server

// PendingMalformed counts the requests s's codec could not decode that no
// interceptor has answered yet.
func PendingMalformed(s *Stubborn) int { return s.svc.malformed.pending() }

// CheckPlaintextListenWith is CheckPlaintextListen resolving names with
// lookup.
var CheckPlaintextListenWith = checkPlaintextListen
