package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
)

// Targets from issue #8.
const (
	targetRunThroughput = 0.8    // run/proxy throughput at the highest concurrency, at least
	targetRunP50        = 1.3    // run/proxy p50 at concurrency 1, at most
	targetHeapPerRun    = 10_000 // bytes of heap per waiting run, at most
	targetWaitingCPU    = 1.0    // % of one core while every run waits, below
	targetWatchP99      = 5.0    // ms, p99 delivery latency to 1,000 watchers, at most
)

func printReport(w io.Writer, rep *Report, what string) {
	m := rep.Machine
	fmt.Fprintf(w, "## Stubborn benchmarks (%s)\n\n", what)
	fmt.Fprintf(w, "Machine: %d CPUs (GOMAXPROCS %d), %s, %s %s; load average %s before, %s after\n\n",
		m.CPUs, m.GOMAXPROCS, m.CPU, m.Go, m.OS, m.LoadAvgBefore, m.LoadAvgAfter)
	fmt.Fprintf(w, "Command: `%s`\n\n", rep.Command)

	if len(rep.Load) > 0 {
		fmt.Fprintln(w, "### Calls (closed loop)")
		fmt.Fprintln(w)
		fmt.Fprintln(w, "| # | scenario | store | concurrency | ops/s | p50 | p99 | CPU/op | allocs/op | bytes/op | errors |")
		fmt.Fprintln(w, "|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|")
		num := map[string]string{"direct": "1", "proxy": "2", "stream": "2b", "stream-live": "2c", "run": "3", "retry": "4"}
		for _, r := range rep.Load {
			store := r.Store
			if store == "" {
				store = "–"
			}
			fmt.Fprintf(w, "| %s | %s | %s | %d | %.0f | %s | %s | %s | %.0f | %s | %d |\n",
				num[r.Scenario], r.Scenario, store, r.Concurrency, r.OpsPerSec, usStr(r.P50us), usStr(r.P99us), usStr(r.CPUusPerOp),
				r.AllocsPerOp, bytesStr(r.BytesPerOp), r.Errors)
		}
		fmt.Fprintln(w)
		for _, r := range rep.Load {
			if r.FirstError != "" {
				fmt.Fprintf(w, "- %s c=%d first error: %s\n", r.Scenario, r.Concurrency, r.FirstError)
			}
		}
		what := "within the run"
		if rep.Runs > 1 {
			what = fmt.Sprintf("median of the %d runs' own ratios", rep.Runs)
		}
		printRatios(w, rep.Ratios, what)
	}

	if len(rep.Waiting) > 0 {
		fmt.Fprintln(w, "### Runs waiting in backoff")
		fmt.Fprintln(w)
		fmt.Fprintln(w, "| store | runs | heap/run | stack/run | RSS/run | goroutines/run | CPU, no runs | CPU, all waiting | start all | cancel all | target |")
		fmt.Fprintln(w, "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|")
		for _, r := range rep.Waiting {
			ok := r.HeapBytesPerRun <= targetHeapPerRun && r.WaitingCPUPercent < targetWaitingCPU
			fmt.Fprintf(w, "| %s | %d | %s | %s | %s | %.2f | %.2f %% | %.2f %% | %.2f s | %.2f s | heap ≤ 10 KB, CPU < 1 %%: %s |\n",
				r.Store, r.Runs, bytesStr(r.HeapBytesPerRun), bytesStr(r.StackBytesPerRun), bytesStr(r.RSSBytesPerRun),
				r.GoroutinesPerRun, r.IdleCPUPercent, r.WaitingCPUPercent, r.StartSeconds, r.CancelSeconds, verdict(ok))
		}
		fmt.Fprintln(w)
	}

	if len(rep.Watch) > 0 {
		fmt.Fprintln(w, "### One run, many WatchRun streams (delivery latency = receive time − event.time)")
		fmt.Fprintln(w)
		fmt.Fprintln(w, "| store | mode | max_batch | watchers | conns | rounds | live events/watcher | samples | messages | emitted over | p50 | p99 | max | target p99 ≤ 5 ms |")
		fmt.Fprintln(w, "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|")
		for _, r := range rep.Watch {
			fmt.Fprintf(w, "| %s | %s | %d | %d | %d | %d | %d | %d | %d | %.1f ms | %.2f ms | %.2f ms | %.2f ms | %s (%.1f×) |\n",
				r.Store, r.Mode, max(r.Batch, 1), r.Watchers, r.Conns, r.Rounds, r.EventsPerWatcher, r.Samples, r.Messages, r.EmitMs,
				r.P50ms, r.P99ms, r.MaxMs, verdict(r.P99ms <= targetWatchP99), r.P99ms/targetWatchP99)
		}
		fmt.Fprintln(w)
	}
}

// Ratio compares two scenarios at one concurrency: A's figure over B's.
type Ratio struct {
	Label       string  `json:"label"`
	Store       string  `json:"store"`
	Concurrency int     `json:"concurrency"`
	Throughput  float64 `json:"throughput"`
	P50         float64 `json:"p50"`
	P99         float64 `json:"p99"`
	CPU         float64 `json:"cpu_per_op"`
	// The targets this row is judged by.
	ThroughputTarget bool `json:"throughput_target,omitempty"`
	P50Target        bool `json:"p50_target,omitempty"`
}

func (r Ratio) key() string { return fmt.Sprintf("%s|%s|%d", r.Label, r.Store, r.Concurrency) }

// ratios computes 3/2 (run/proxy), 4/1 (retry/direct), 3/2b and 2b/2 at
// every concurrency of one run.
func ratios(load []LoadResult) []Ratio {
	find := func(sc, store string, c int) (LoadResult, bool) {
		for _, r := range load {
			if r.Scenario == sc && r.Store == store && r.Concurrency == c {
				return r, true
			}
		}
		return LoadResult{}, false
	}
	var concs []int
	var stores []string
	for _, r := range load {
		if !slices.Contains(concs, r.Concurrency) {
			concs = append(concs, r.Concurrency)
		}
		if r.Store != "" && !slices.Contains(stores, r.Store) {
			stores = append(stores, r.Store)
		}
	}
	slices.Sort(concs)
	if len(concs) == 0 {
		return nil
	}
	lo, hi := concs[0], concs[len(concs)-1]
	var out []Ratio
	for _, store := range stores {
		for _, pair := range [][2]string{{"run", "proxy"}, {"retry", "direct"}, {"run", "stream"}, {"stream", "proxy"}, {"run", "stream-live"}, {"stream-live", "proxy"}} {
			label := map[string]string{
				"run/proxy": "3/2 run ÷ proxy", "retry/direct": "4/1 retry ÷ direct",
				"run/stream": "3/2b run ÷ stream", "stream/proxy": "2b/2 stream ÷ proxy",
				"run/stream-live": "3/2c run ÷ stream-live", "stream-live/proxy": "2c/2 stream-live ÷ proxy",
			}[pair[0]+"/"+pair[1]]
			storeOf := func(sc string) string {
				if sc == "run" || sc == "retry" {
					return store
				}
				return ""
			}
			for _, c := range concs {
				a, okA := find(pair[0], storeOf(pair[0]), c)
				b, okB := find(pair[1], storeOf(pair[1]), c)
				if !okA || !okB || b.OpsPerSec == 0 || b.P50us == 0 || b.P99us == 0 || b.CPUusPerOp == 0 {
					continue
				}
				main := pair == [2]string{"run", "proxy"}
				out = append(out, Ratio{
					Label: label, Store: store, Concurrency: c,
					Throughput: a.OpsPerSec / b.OpsPerSec, P50: a.P50us / b.P50us, P99: a.P99us / b.P99us,
					CPU:              a.CPUusPerOp / b.CPUusPerOp,
					ThroughputTarget: main && c == hi, P50Target: main && c == lo,
				})
			}
		}
	}
	return out
}

// printRatios prints the ratios and the verdicts on the targets.
func printRatios(w io.Writer, rs []Ratio, what string) {
	if len(rs) == 0 {
		return
	}
	fmt.Fprintf(w, "### Ratios (%s)\n\n", what)
	fmt.Fprintln(w, "| ratio | store | concurrency | throughput | p50 | p99 | CPU/op | target |")
	fmt.Fprintln(w, "|---|---|--:|--:|--:|--:|--:|---|")
	for _, r := range rs {
		var targets []string
		if r.ThroughputTarget {
			targets = append(targets, fmt.Sprintf("throughput ≥ %.1f: %s", targetRunThroughput, verdict(r.Throughput >= targetRunThroughput)))
		}
		if r.P50Target {
			targets = append(targets, fmt.Sprintf("p50 ≤ %.1f: %s", targetRunP50, verdict(r.P50 <= targetRunP50)))
		}
		target := "–"
		if len(targets) > 0 {
			target = strings.Join(targets, "; ")
		}
		fmt.Fprintf(w, "| %s | %s | %d | %.2f | %.2f | %.2f | %.2f | %s |\n", r.Label, r.Store, r.Concurrency, r.Throughput, r.P50, r.P99, r.CPU, target)
	}
	fmt.Fprintln(w)
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "**missed**"
}

func usStr(v float64) string {
	if v >= 1000 {
		return fmt.Sprintf("%.2f ms", v/1000)
	}
	return fmt.Sprintf("%.0f µs", v)
}

func bytesStr(b float64) string {
	switch {
	case b >= 1<<20 || b <= -(1<<20):
		return fmt.Sprintf("%.1f MiB", b/(1<<20))
	case b >= 1000 || b <= -1000:
		return fmt.Sprintf("%.2f KB", b/1000)
	}
	return fmt.Sprintf("%.0f B", b)
}

// medianOf reads reports written with -json and returns one whose every
// number is the median of that number across them (each metric on its own).
func medianOf(files []string) (*Report, error) {
	var reps []*Report
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		var r Report
		if err := json.Unmarshal(b, &r); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		reps = append(reps, &r)
	}
	if len(reps) == 0 {
		return nil, fmt.Errorf("no files")
	}
	out := &Report{Machine: reps[0].Machine, Command: reps[0].Command}
	var before, after []string
	for _, r := range reps {
		before = append(before, r.Machine.LoadAvgBefore)
		after = append(after, r.Machine.LoadAvgAfter)
	}
	out.Machine.LoadAvgBefore = strings.Join(before, ", ")
	out.Machine.LoadAvgAfter = strings.Join(after, ", ")
	for _, base := range reps[0].Load {
		out.Load = append(out.Load, medianLoad(base, collect(reps, func(r *Report) []LoadResult { return r.Load }, base.key(), LoadResult.key)))
	}
	for _, r := range reps {
		if len(r.Ratios) == 0 { // written before ratios were saved
			r.Ratios = ratios(r.Load)
		}
	}
	for _, base := range reps[0].Ratios {
		vs := collect(reps, func(r *Report) []Ratio { return r.Ratios }, base.key(), Ratio.key)
		m := base
		m.Throughput = median(vs, func(v Ratio) float64 { return v.Throughput })
		m.P50 = median(vs, func(v Ratio) float64 { return v.P50 })
		m.P99 = median(vs, func(v Ratio) float64 { return v.P99 })
		m.CPU = median(vs, func(v Ratio) float64 { return v.CPU })
		out.Ratios = append(out.Ratios, m)
	}
	out.Runs = len(reps)
	for _, base := range reps[0].Waiting {
		key := func(r WaitingResult) string { return r.Store }
		out.Waiting = append(out.Waiting, medianWaiting(base, collect(reps, func(r *Report) []WaitingResult { return r.Waiting }, key(base), key)))
	}
	for _, base := range reps[0].Watch {
		key := func(r WatchResult) string { return fmt.Sprintf("%s|%s|%d", r.Store, r.Mode, r.Batch) }
		out.Watch = append(out.Watch, medianWatch(base, collect(reps, func(r *Report) []WatchResult { return r.Watch }, key(base), key)))
	}
	return out, nil
}

// collect returns the result with key from every report.
func collect[T any](reps []*Report, list func(*Report) []T, key string, keyOf func(T) string) []T {
	var out []T
	for _, r := range reps {
		for _, v := range list(r) {
			if keyOf(v) == key {
				out = append(out, v)
				break
			}
		}
	}
	return out
}

func median[T any](vs []T, f func(T) float64) float64 {
	xs := make([]float64, len(vs))
	for i, v := range vs {
		xs[i] = f(v)
	}
	slices.Sort(xs)
	n := len(xs)
	if n == 0 {
		return 0
	}
	if n%2 == 1 {
		return xs[n/2]
	}
	return (xs[n/2-1] + xs[n/2]) / 2
}

func medianLoad(r LoadResult, vs []LoadResult) LoadResult {
	r.Ops = int64(median(vs, func(v LoadResult) float64 { return float64(v.Ops) }))
	r.Errors = int64(median(vs, func(v LoadResult) float64 { return float64(v.Errors) }))
	r.OpsPerSec = median(vs, func(v LoadResult) float64 { return v.OpsPerSec })
	r.P50us = median(vs, func(v LoadResult) float64 { return v.P50us })
	r.P99us = median(vs, func(v LoadResult) float64 { return v.P99us })
	r.CPUusPerOp = median(vs, func(v LoadResult) float64 { return v.CPUusPerOp })
	r.AllocsPerOp = median(vs, func(v LoadResult) float64 { return v.AllocsPerOp })
	r.BytesPerOp = median(vs, func(v LoadResult) float64 { return v.BytesPerOp })
	r.FirstError = ""
	return r
}

func medianWaiting(r WaitingResult, vs []WaitingResult) WaitingResult {
	r.HeapBytesPerRun = median(vs, func(v WaitingResult) float64 { return v.HeapBytesPerRun })
	r.StackBytesPerRun = median(vs, func(v WaitingResult) float64 { return v.StackBytesPerRun })
	r.RSSBytesPerRun = median(vs, func(v WaitingResult) float64 { return v.RSSBytesPerRun })
	r.GoroutinesPerRun = median(vs, func(v WaitingResult) float64 { return v.GoroutinesPerRun })
	r.IdleCPUPercent = median(vs, func(v WaitingResult) float64 { return v.IdleCPUPercent })
	r.WaitingCPUPercent = median(vs, func(v WaitingResult) float64 { return v.WaitingCPUPercent })
	r.StartSeconds = median(vs, func(v WaitingResult) float64 { return v.StartSeconds })
	r.CancelSeconds = median(vs, func(v WaitingResult) float64 { return v.CancelSeconds })
	return r
}

func medianWatch(r WatchResult, vs []WatchResult) WatchResult {
	r.Rounds = int(median(vs, func(v WatchResult) float64 { return float64(v.Rounds) }))
	r.Samples = int(median(vs, func(v WatchResult) float64 { return float64(v.Samples) }))
	r.Messages = int(median(vs, func(v WatchResult) float64 { return float64(v.Messages) }))
	r.P50ms = median(vs, func(v WatchResult) float64 { return v.P50ms })
	r.P99ms = median(vs, func(v WatchResult) float64 { return v.P99ms })
	r.MaxMs = median(vs, func(v WatchResult) float64 { return v.MaxMs })
	r.EmitMs = median(vs, func(v WatchResult) float64 { return v.EmitMs })
	return r
}
