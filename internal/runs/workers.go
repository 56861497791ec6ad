package runs

import "sync"

// A run's control goes deep (control, attempt, delegate call, gRPC), so a
// goroutine started for each run grows its stack by copying it, twice or
// more, before its first delegate call. The Manager drives runs on
// goroutines it keeps between runs instead, as gRPC's stream workers do:
// a run goes to an idle one, or to a new one when none is idle.

// maxIdleWorkers bounds the goroutines kept waiting for a run; more finish
// when they are done.
const maxIdleWorkers = 64

// workerRuns is how many runs a worker drives before it hands over to a new
// goroutine, so that a stack grown by one deep run is not kept forever.
const workerRuns = 1 << 12

// workers hands functions to idle goroutines.
type workers struct {
	work    chan func()   // unbuffered: a send succeeds when a worker waits
	quit    chan struct{} // closed by stop
	mu      sync.Mutex
	idle    int
	spawned int // goroutines started, for tests
	wg      sync.WaitGroup
	once    sync.Once
}

func newWorkers() *workers {
	return &workers{work: make(chan func()), quit: make(chan struct{})}
}

// run runs f on an idle worker, or on a new one.
func (w *workers) run(f func()) {
	select {
	case w.work <- f:
	default:
		w.mu.Lock()
		w.spawned++
		w.mu.Unlock()
		w.wg.Add(1)
		go w.loop(f)
	}
}

func (w *workers) loop(f func()) {
	defer w.wg.Done()
	for n := 0; ; n++ {
		f()
		f = nil // what the run's closure holds goes with it, not with the idle worker
		if n == workerRuns {
			return
		}
		w.mu.Lock()
		if w.idle >= maxIdleWorkers {
			w.mu.Unlock()
			return
		}
		w.idle++
		w.mu.Unlock()
		select {
		case f = <-w.work:
		case <-w.quit:
			return
		}
		w.mu.Lock()
		w.idle--
		w.mu.Unlock()
	}
}

// stop ends the idle workers and waits for every worker to end; the busy
// ones end with the function they run.
func (w *workers) stop() {
	w.once.Do(func() { close(w.quit) })
	w.wg.Wait()
}
