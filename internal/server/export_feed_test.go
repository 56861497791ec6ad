package server

// FeedWatchers counts the WatchRuns streams s follows the runs for.
func FeedWatchers(s *Stubborn) int { return int(s.svc.following.Load()) }
