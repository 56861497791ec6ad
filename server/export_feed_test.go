package server

// FeedWatchers counts the WatchRuns streams s's run feed serves (the memory
// store's; a store with an index follows without it).
func FeedWatchers(s *Stubborn) int { return int(s.svc.feed.n.Load()) }
