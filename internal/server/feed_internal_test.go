package server

import (
	"testing"

	"github.com/stretchr/testify/assert"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// A stream that falls feedBuffer changes behind is ended, never waited
// for.
func TestAFeedSubNeverBlocks(t *testing.T) {
	sub := newFeedSub()
	msg := &stubbornv1.WatchRunsResponse{Run: &stubbornv1.RunSummary{RunId: "r", Control: "retry"}}
	for range feedBuffer {
		sub.offer(msg)
	}
	select {
	case <-sub.overflow:
		t.Fatal("ended before it fell behind")
	default:
	}
	assert.Len(t, sub.c, feedBuffer)
	sub.offer(msg)
	<-sub.overflow
	sub.offer(msg) // once ended, offers change nothing
	assert.Len(t, sub.c, feedBuffer)
}
