package server

import (
	"testing"

	"github.com/stretchr/testify/assert"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
	"github.com/stubbornhq/stubborn/runs"
)

// A stream that falls feedBuffer changes behind is ended, never waited
// for; another tenant's runs and filtered-out runs never reach it.
func TestRunFeedNeverBlocks(t *testing.T) {
	f := newRunFeed()
	sub := newFeedSub([]string{"a"}, runs.Filter{Control: "retry"})
	cancel := f.subscribe(sub)
	defer cancel()
	retry := &stubbornv1.RunSummary{RunId: "r", Control: "retry"}
	f.publish("b", retry)
	f.publish("a", &stubbornv1.RunSummary{RunId: "c", Control: "race"})
	assert.Empty(t, sub.c)
	for range feedBuffer {
		f.publish("a", retry)
	}
	select {
	case <-sub.overflow:
		t.Fatal("ended before it fell behind")
	default:
	}
	f.publish("a", retry)
	<-sub.overflow
	cancel()
	cancel()
	assert.Zero(t, f.n.Load(), "cancel is idempotent")
}
