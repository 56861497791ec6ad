package delegatekit

// DefaultListenFrom is defaultListen, for the tests.
var DefaultListenFrom = defaultListen
