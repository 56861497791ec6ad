package main

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"time"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// WaitingResult is scenario 5: many runs waiting in backoff at once.
type WaitingResult struct {
	Store string `json:"store"`
	Runs  int    `json:"runs"`
	// Per waiting run, measured after a full GC against the same server
	// before the runs started.
	HeapBytesPerRun  float64 `json:"heap_bytes_per_run"`
	StackBytesPerRun float64 `json:"stack_bytes_per_run"`
	RSSBytesPerRun   float64 `json:"rss_bytes_per_run"`
	GoroutinesPerRun float64 `json:"goroutines_per_run"`
	// CPU used by the whole process over the idle window, in % of one core:
	// before any run started, and while every run waits.
	IdleCPUPercent    float64 `json:"idle_cpu_percent"`
	WaitingCPUPercent float64 `json:"waiting_cpu_percent"`
	// How long starting them all (until every one waits) and cancelling them
	// all took.
	StartSeconds  float64 `json:"start_seconds"`
	CancelSeconds float64 `json:"cancel_seconds"`
}

type memPoint struct {
	heap, stack, rss int64
	goroutines       int
}

func measureMem() memPoint {
	debug.FreeOSMemory() // a full GC, and the freed pages back to the OS
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return memPoint{heap: int64(ms.HeapAlloc), stack: int64(ms.StackInuse), rss: rss(), goroutines: runtime.NumGoroutine()}
}

// writeHeapProfile writes the live heap, as of the last GC, to file.
func writeHeapProfile(file string) error {
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// cpuPercent returns the process's CPU use over d, in % of one core.
func cpuPercent(d time.Duration) float64 {
	c0, t0 := cpuTime(), time.Now()
	time.Sleep(d)
	c1, el := cpuTime(), time.Since(t0)
	if c0 < 0 || c1 < 0 {
		return -1
	}
	return 100 * float64(c1-c0) / float64(el)
}

// runWaiting starts n retry runs whose attempts all fail and whose backoff
// waits are drawn from [0, 1000h], so that they all sit in backoff (full
// jitter may draw a short wait: such a run makes another attempt, which
// fails, and waits again; 10 short draws in a row are beyond chance); measures
// memory per waiting run and CPU while they all wait; then cancels them.
func runWaiting(ctx context.Context, w *world, store string, n int, idle time.Duration, conc int, heapProfile, idleProfile string) (WaitingResult, error) {
	res := WaitingResult{Store: store, Runs: n}
	s, err := startStubborn(w, store, 1)
	if err != nil {
		return res, err
	}
	defer s.stop()
	// Warm the server, its delegate connection and the client connection,
	// so that the baseline holds them.
	if err := runOp(s.client, oneAttemptRun(), 1)(ctx); err != nil {
		return res, fmt.Errorf("warm-up run: %w", err)
	}

	before := measureMem()
	res.IdleCPUPercent = cpuPercent(idle)

	const wait = 1000 * time.Hour
	req := &stubbornv1.StartRunRequest{}
	{
		r := retryRun(downName, 10, wait, wait)
		req.TaskBrief, req.Retry = r.TaskBrief, r.Retry
	}
	calls0 := w.down.calls.Load()
	t0 := time.Now()
	ids := make([]string, n)
	var next atomic.Int64
	var firstErr error
	var errOnce sync.Once
	var wg sync.WaitGroup
	for range conc {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				resp, err := s.client.StartRun(ctx, req)
				if err != nil {
					errOnce.Do(func() { firstErr = err })
					return
				}
				ids[i] = resp.GetRunId()
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return res, fmt.Errorf("StartRun: %w", firstErr)
	}
	// Every run waits once its first attempt has failed and its backoff is
	// scheduled.
	for {
		if w.down.calls.Load()-calls0 >= int64(n) {
			list, _, err := s.srv.Runs.List(ctx, stubbornv1.RunStatus_RUN_STATUS_BACKING_OFF, n+1, "")
			if err != nil {
				return res, err
			}
			if len(list) >= n {
				break
			}
		}
		if ctx.Err() != nil {
			return res, ctx.Err()
		}
		time.Sleep(50 * time.Millisecond)
	}
	res.StartSeconds = time.Since(t0).Seconds()

	after := measureMem()
	if heapProfile != "" {
		if err := writeHeapProfile(heapProfile); err != nil {
			return res, err
		}
	}
	per := func(a, b int64) float64 { return float64(b-a) / float64(n) }
	res.HeapBytesPerRun = per(before.heap, after.heap)
	res.StackBytesPerRun = per(before.stack, after.stack)
	res.RSSBytesPerRun = per(before.rss, after.rss)
	res.GoroutinesPerRun = per(int64(before.goroutines), int64(after.goroutines))
	if idleProfile != "" {
		f, err := os.Create(idleProfile)
		if err != nil {
			return res, err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return res, err
		}
	}
	res.WaitingCPUPercent = cpuPercent(idle)
	if idleProfile != "" {
		pprof.StopCPUProfile()
	}

	t1 := time.Now()
	next.Store(0)
	for range conc {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				resp, err := s.client.CancelRun(ctx, &stubbornv1.CancelRunRequest{RunId: ids[i]})
				if err == nil && resp.GetState().GetStatus() != stubbornv1.RunStatus_RUN_STATUS_CANCELLED {
					err = fmt.Errorf("run %s ended %s after CancelRun", ids[i], resp.GetState().GetStatus())
				}
				if err != nil {
					errOnce.Do(func() { firstErr = err })
					return
				}
			}
		})
	}
	wg.Wait()
	res.CancelSeconds = time.Since(t1).Seconds()
	if firstErr != nil {
		return res, fmt.Errorf("CancelRun: %w", firstErr)
	}
	return res, nil
}
