package runs

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const (
	testWait = 10 * time.Second
	tick     = time.Millisecond
)

func (w *workers) counts() (idle, spawned int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.idle, w.spawned
}

func TestWorkersReuseIdleGoroutines(t *testing.T) {
	w := newWorkers()
	defer w.stop()
	for i := range 100 {
		done := make(chan struct{})
		w.run(func() { close(done) })
		<-done
		// The worker counts itself idle a moment after f returns (and a run
		// handed over before it waits gets a second one: both stay idle).
		require.Eventually(t, func() bool { idle, _ := w.counts(); return idle >= 1 }, testWait, tick, "run %d", i)
	}
	// A worker counts itself idle just before it waits for work, so a run
	// handed over in between gets a new goroutine: rare, not never.
	_, spawned := w.counts()
	assert.LessOrEqual(t, spawned, 10, "the 100 runs one after another reused their goroutines")
}

func TestWorkersKeepAtMostMaxIdle(t *testing.T) {
	w := newWorkers()
	const n = maxIdleWorkers + 36
	release := make(chan struct{})
	var started sync.WaitGroup
	started.Add(n)
	for range n {
		w.run(func() {
			started.Done()
			<-release
		})
	}
	started.Wait()
	_, spawned := w.counts()
	assert.Equal(t, n, spawned, "busy workers are not waited for: each run got a goroutine")
	close(release)
	require.Eventually(t, func() bool { idle, _ := w.counts(); return idle == maxIdleWorkers }, testWait, tick)

	ran := make(chan struct{})
	w.run(func() { close(ran) })
	<-ran
	_, spawned = w.counts()
	assert.Equal(t, n, spawned, "an idle worker took the next run")
	w.stop() // ends the idle ones: the package's goleak check sees none left
	w.stop() // and may be called again
}
