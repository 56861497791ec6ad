package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	stubbornv1 "github.com/stubbornhq/stubborn/gen/stubborn/v1"
)

// The brief every scenario sends.
const brief = "bench: summarise the report"

// LoadResult is one closed-loop measurement: conc callers, each calling op
// again as soon as the previous call returned.
type LoadResult struct {
	Scenario    string  `json:"scenario"`
	Store       string  `json:"store,omitempty"`
	Concurrency int     `json:"concurrency"`
	Ops         int64   `json:"ops"`
	Errors      int64   `json:"errors"`
	OpsPerSec   float64 `json:"ops_per_sec"`
	P50us       float64 `json:"p50_us"`
	P99us       float64 `json:"p99_us"`
	// CPU time of the whole process (callers, servers, delegate) per
	// counted call: less sensitive than throughput to other load on the
	// machine.
	CPUusPerOp float64 `json:"cpu_us_per_op"`
	// Allocations of the whole process per counted call.
	AllocsPerOp float64 `json:"allocs_per_op"`
	BytesPerOp  float64 `json:"bytes_per_op"`
	FirstError  string  `json:"first_error,omitempty"`

	// The streaming scenarios (streaming.go), over every counted call: the
	// time from the request to the first and to the last text received
	// (P50us and P99us are the whole call's), the text's bytes and the
	// messages that carried it per call, those messages per second of
	// streaming, the runs with more attempt_output events than the
	// coalescing allows (outputBound) and the calls these are of.
	TTFOP50us        float64 `json:"ttfo_p50_us,omitempty"`
	TTFOP99us        float64 `json:"ttfo_p99_us,omitempty"`
	TTLOP50us        float64 `json:"ttlo_p50_us,omitempty"`
	TTLOP99us        float64 `json:"ttlo_p99_us,omitempty"`
	OutputBytesPerOp float64 `json:"output_bytes_per_op,omitempty"`
	OutputMsgsPerOp  float64 `json:"output_msgs_per_op,omitempty"`
	OutputMsgsPerSec float64 `json:"output_msgs_per_sec,omitempty"`
	OverBound        int64   `json:"over_bound,omitempty"`
	StreamedCalls    int64   `json:"streamed_calls,omitempty"`
	// WindowBytes is the text a streaming client received within its
	// measured window (window); ServerCPUusPerKB and DelegateCPUusPerKB
	// the server's and the delegate's CPU time per 1,000 bytes of it.
	WindowBytes        int64   `json:"window_bytes,omitempty"`
	ServerCPUusPerKB   float64 `json:"server_cpu_us_per_kb,omitempty"`
	DelegateCPUusPerKB float64 `json:"delegate_cpu_us_per_kb,omitempty"`
	// TTFOSplitP50us: through Stubborn, the median of each part of a run's
	// time to first output (streamSample.Split).
	TTFOSplitP50us []float64 `json:"ttfo_split_p50_us,omitempty"`
	// Samples are a streaming client's calls, each as it saw it: from the
	// client to the bench only (merged by mergeStreaming, then dropped).
	Samples []streamSample `json:"samples,omitempty"`

	// The shipped scenarios (shipped.go), each process on its own, from
	// /proc: there, CPUusPerOp is the sum of these and the client's, and
	// AllocsPerOp and BytesPerOp are 0 (not measured across processes).
	//
	// ServerCPUusPerOp is the CPU time per counted call of the process
	// between the client and the delegate: the proxy, `stubborn serve`, or
	// a peer's server; ServerRSSBytes its peak resident set (VmHWM).
	ServerCPUusPerOp float64 `json:"server_cpu_us_per_op,omitempty"`
	ServerRSSBytes   int64   `json:"server_rss_bytes,omitempty"`
	// WorkerCPUusPerOp and WorkerRSSBytes are a peer's worker process's
	// (Temporal's calls the delegate).
	WorkerCPUusPerOp float64 `json:"worker_cpu_us_per_op,omitempty"`
	WorkerRSSBytes   int64   `json:"worker_rss_bytes,omitempty"`
	// DelegateCPUusPerOp is the delegate process's; ClientCPUusPerOp the
	// client process's, as it measured itself.
	DelegateCPUusPerOp float64 `json:"delegate_cpu_us_per_op,omitempty"`
	ClientCPUusPerOp   float64 `json:"client_cpu_us_per_op,omitempty"`
}

func (r LoadResult) key() string { return fmt.Sprintf("%s|%s|%d", r.Scenario, r.Store, r.Concurrency) }

// op is one call of a scenario; an error counts against it.
type op func(ctx context.Context) error

// measured is what runLoad saw: the latency of every counted call, the
// failed calls, and the process's CPU time and allocations over the
// measured window.
type measured struct {
	lat            []time.Duration
	errs           int64
	firstErr       error
	window, cpu    time.Duration
	mallocs, bytes uint64
}

// add merges n into m.
func (m *measured) add(n measured) {
	m.lat = append(m.lat, n.lat...)
	m.errs += n.errs
	if m.firstErr == nil {
		m.firstErr = n.firstErr
	}
	m.window += n.window
	m.cpu += n.cpu
	m.mallocs += n.mallocs
	m.bytes += n.bytes
}

// runLoad runs op from conc goroutines for warmup+dur. Only calls that start
// after the warmup and end before the deadline are counted, so throughput is
// counted calls / dur.
func runLoad(ctx context.Context, conc int, warmup, dur time.Duration, fn op) measured {
	return runLoadWith(ctx, conc, warmup, dur, func(ctx context.Context) (func(), error) { return nil, fn(ctx) })
}

// runLoadWith is runLoad for a call that returns, besides its error, a
// function to call if the call is counted (nil: none).
func runLoadWith(ctx context.Context, conc int, warmup, dur time.Duration, fn func(context.Context) (func(), error)) (m measured) {
	start := time.Now()
	from, end := start.Add(warmup), start.Add(warmup+dur)
	ctx, cancel := context.WithDeadline(ctx, end.Add(30*time.Second))
	defer cancel()
	type worker struct {
		lat  []time.Duration
		errs int64
		err  error
	}
	ws := make([]worker, conc)
	var wg sync.WaitGroup
	var ms0, ms1 runtime.MemStats
	var cpu0, cpu1 time.Duration
	wg.Go(func() {
		time.Sleep(time.Until(from))
		cpu0 = cpuTime()
		runtime.ReadMemStats(&ms0)
		time.Sleep(time.Until(end))
		cpu1 = cpuTime()
		runtime.ReadMemStats(&ms1)
	})
	for i := range ws {
		w := &ws[i]
		w.lat = make([]time.Duration, 0, 1<<12)
		wg.Go(func() {
			for {
				t0 := time.Now()
				if !t0.Before(end) || ctx.Err() != nil {
					return
				}
				keep, err := fn(ctx)
				t1 := time.Now()
				if t0.Before(from) || t1.After(end) {
					continue
				}
				if err != nil {
					w.errs++
					if w.err == nil {
						w.err = err
					}
					continue
				}
				w.lat = append(w.lat, t1.Sub(t0))
				if keep != nil {
					keep()
				}
			}
		})
	}
	wg.Wait()
	for _, w := range ws {
		m.lat = append(m.lat, w.lat...)
		m.errs += w.errs
		if m.firstErr == nil {
			m.firstErr = w.err
		}
	}
	m.window = dur
	m.cpu = cpu1 - cpu0
	m.mallocs = ms1.Mallocs - ms0.Mallocs
	m.bytes = ms1.TotalAlloc - ms0.TotalAlloc
	return m
}

// percentile returns the nearest-rank q-quantile of sorted.
func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.999999) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func summarize(scenario, store string, conc int, m measured) LoadResult {
	slices.Sort(m.lat)
	ops := int64(len(m.lat))
	r := LoadResult{
		Scenario: scenario, Store: store, Concurrency: conc,
		Ops: ops, Errors: m.errs,
		OpsPerSec: float64(ops) / m.window.Seconds(),
		P50us:     us(percentile(m.lat, 0.50)),
		P99us:     us(percentile(m.lat, 0.99)),
	}
	if ops > 0 {
		r.CPUusPerOp = us(m.cpu) / float64(ops)
		r.AllocsPerOp = float64(m.mallocs) / float64(ops)
		r.BytesPerOp = float64(m.bytes) / float64(ops)
	}
	if m.firstErr != nil {
		r.FirstError = m.firstErr.Error()
	}
	return r
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// directOp is scenario 1 or 2: one unary Execute on c.
func directOp(c stubbornv1.DelegateServiceClient) op {
	req := &stubbornv1.ExecuteRequest{Brief: brief}
	return func(ctx context.Context) error {
		resp, err := c.Execute(ctx, req)
		if err != nil {
			return err
		}
		if resp.GetResult().GetText() == "" {
			return errors.New("empty result")
		}
		return nil
	}
}

// runOp is scenarios 3 and 4: Run, its stream read to its end, which must
// be a run_finished event with status SUCCEEDED after attempts attempts.
func runOp(c stubbornv1.ControlServiceClient, req *stubbornv1.RunRequest, attempts int32) op {
	return func(ctx context.Context) error {
		s, err := c.Run(ctx, req)
		if err != nil {
			return err
		}
		var last *stubbornv1.RunEvent
		for {
			m, err := s.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return err
			}
			last = m.GetEvent()
		}
		st := last.GetRunFinished().GetState()
		if st.GetStatus() != stubbornv1.RunStatus_RUN_STATUS_SUCCEEDED || st.GetAttempts() != attempts {
			return fmt.Errorf("run ended %s after %d attempts (%s)", st.GetStatus(), st.GetAttempts(), st.GetStatusReason())
		}
		return nil
	}
}

// capture runs req on c once and returns its events.
func capture(ctx context.Context, c stubbornv1.ControlServiceClient, req *stubbornv1.RunRequest) ([]*stubbornv1.RunEvent, error) {
	s, err := c.Run(ctx, req)
	if err != nil {
		return nil, err
	}
	var evs []*stubbornv1.RunEvent
	for {
		m, err := s.Recv()
		if errors.Is(err, io.EOF) {
			return evs, nil
		}
		if err != nil {
			return nil, err
		}
		evs = append(evs, m.GetEvent())
	}
}

// oneAttemptRun is scenario 3: a fallback chain of one delegate that
// answers.
func oneAttemptRun() *stubbornv1.RunRequest {
	return &stubbornv1.RunRequest{
		TaskBrief:     brief,
		FallbackChain: &stubbornv1.FallbackChainSpec{Chain: []string{echoName}},
	}
}

// retryRun is a retry of target with retries retries after the first try,
// full-jitter waits in [0, min(maxWait, base·2^(n-1))], failing at once
// when the retries run out.
func retryRun(target string, retries int32, base, maxWait time.Duration) *stubbornv1.RunRequest {
	return &stubbornv1.RunRequest{
		TaskBrief: brief,
		Retry: &stubbornv1.RetrySpec{
			Target:      target,
			Attempts:    &retries,
			BaseWait:    durationpb.New(base),
			MaxWait:     durationpb.New(maxWait),
			OnExhausted: stubbornv1.OnExhausted_ON_EXHAUSTED_FAIL,
		},
	}
}
