//go:build !unix

package main

import "time"

// cpuTime is unknown here.
func cpuTime() time.Duration { return -1 }

// rss is unknown here.
func rss() int64 { return -1 }
