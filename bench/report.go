package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
)

// Targets from issue #8 (the ratios' are in ratios.go).
const (
	targetHeapPerRun = 10_000 // bytes of heap per waiting run, at most
	targetWaitingCPU = 1.0    // % of one core while every run waits, below
	targetWatchP99   = 5.0    // ms, p99 delivery latency to 1,000 watchers, at most
)

func printReport(w io.Writer, rep *Report, what string) {
	m := rep.Machine
	fmt.Fprintf(w, "## Stubborn benchmarks (%s)\n\n", what)
	fmt.Fprintf(w, "Machine: %d CPUs (GOMAXPROCS %d), %s, %s %s; load average %s before, %s after\n\n",
		m.CPUs, m.GOMAXPROCS, m.CPU, m.Go, m.OS, m.LoadAvgBefore, m.LoadAvgAfter)
	fmt.Fprintf(w, "Command: `%s`\n\n", rep.Command)

	inProcess := slices.DeleteFunc(slices.Clone(rep.Load), func(r LoadResult) bool { return isShipped(r.Scenario) })
	shipped := slices.DeleteFunc(slices.Clone(rep.Load), func(r LoadResult) bool { return !isShipped(r.Scenario) })
	if len(inProcess) > 0 {
		fmt.Fprintln(w, "### Calls (closed loop)")
		fmt.Fprintln(w)
		fmt.Fprintln(w, "| # | scenario | store | concurrency | ops/s | p50 | p99 | CPU/op | allocs/op | bytes/op | errors |")
		fmt.Fprintln(w, "|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|")
		num := map[string]string{"direct": "1", "proxy": "2", "stream": "2b", "stream-live": "2c", "run": "3", "retry": "4"}
		for _, r := range inProcess {
			store := r.Store
			if store == "" {
				store = "–"
			}
			fmt.Fprintf(w, "| %s | %s | %s | %d | %.0f | %s | %s | %s | %.0f | %s | %d |\n",
				num[r.Scenario], r.Scenario, store, r.Concurrency, r.OpsPerSec, usStr(r.P50us), usStr(r.P99us), usStr(r.CPUusPerOp),
				r.AllocsPerOp, bytesStr(r.BytesPerOp), r.Errors)
		}
		fmt.Fprintln(w)
		printErrors(w, inProcess)
	}
	printShipped(w, shipped)
	within := "within the run"
	if rep.Runs > 1 {
		within = fmt.Sprintf("median of the %d runs' own ratios", rep.Runs)
	}
	printRatios(w, rep.Ratios, within)
	streamWhat := "one run"
	if rep.Runs > 1 {
		streamWhat = fmt.Sprintf("medians of the %d runs' own figures and differences", rep.Runs)
	}
	printStreaming(w, rep.Streaming, streamWhat)
	printFrontDoor(w, rep.Load)

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

func printErrors(w io.Writer, load []LoadResult) {
	for _, r := range load {
		if r.FirstError != "" {
			fmt.Fprintf(w, "- %s %s c=%d first error: %s\n", r.Scenario, r.Store, r.Concurrency, r.FirstError)
		}
	}
}

// shippedRows name the shipped scenarios' targets as issue #21 does.
var shippedRows = []struct{ scenario, store, label string }{
	{"proc-direct", "", "direct: unary Execute to the delegate (its own process)"},
	{"proc-proxy", "", "plain gRPC proxy (its own process) in front of it"},
	{"proc-run", "memory", "`stubborn serve -memory`, `fallback_chain [echo]`"},
	{"proc-run", "embedded-interval", "`stubborn serve` (default: embedded JetStream, interval fsync), `fallback_chain [echo]`"},
	{"proc-run", "embedded-always", "`stubborn serve -durability always`, `fallback_chain [echo]`"},
	{"temporal-one", "", "Temporal peer, one attempt"},
	{"proc-retry", "memory", "`stubborn serve -memory`, retry: 3 attempts"},
	{"proc-retry", "embedded-interval", "`stubborn serve` (default), retry: 3 attempts"},
	{"proc-retry", "embedded-always", "`stubborn serve -durability always`, retry: 3 attempts"},
	{"temporal-retry3", "", "Temporal peer, 3 attempts"},
}

// printShipped prints the shipped scenarios' results: issue #21's table
// (p50 at the lowest concurrency, throughput at the highest), then every
// measurement with each process's CPU per call.
func printShipped(w io.Writer, load []LoadResult) {
	if len(load) == 0 {
		return
	}
	var concs []int
	for _, r := range load {
		if !slices.Contains(concs, r.Concurrency) {
			concs = append(concs, r.Concurrency)
		}
	}
	slices.Sort(concs)
	lo, hi := concs[0], concs[len(concs)-1]
	find := func(sc, store string, c int) (LoadResult, bool) {
		i := slices.IndexFunc(load, func(r LoadResult) bool { return r.Scenario == sc && r.Store == store && r.Concurrency == c })
		if i < 0 {
			return LoadResult{}, false
		}
		return load[i], true
	}
	proxyLo, _ := find("proc-proxy", "", lo)
	proxyHi, _ := find("proc-proxy", "", hi)
	fmt.Fprintln(w, "### Shipped binary, each piece in its own process (issue 21)")
	fmt.Fprintln(w)
	if slices.ContainsFunc(load, func(r LoadResult) bool { return !streaming(r.Scenario) }) {
		printIssue21(w, lo, hi, find, proxyLo, proxyHi)
	}
	fmt.Fprintln(w, "CPU/op: each process's CPU time (/proc) over the calls counted in its windows; all = client + server + worker + delegate. Streaming scenarios: p50 and p99 are the whole call's (see the streamed output table).")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| scenario | store | concurrency | ops/s | p50 | p99 | CPU/op all | server | worker | delegate | client | server max RSS | errors |")
	fmt.Fprintln(w, "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
	for _, r := range load {
		store := r.Store
		if store == "" {
			store = "–"
		}
		fmt.Fprintf(w, "| %s | %s | %d | %.0f | %s | %s | %s | %s | %s | %s | %s | %s | %d |\n",
			r.Scenario, store, r.Concurrency, r.OpsPerSec, usStr(r.P50us), usStr(r.P99us), orDash(r.CPUusPerOp, usStr),
			orDash(r.ServerCPUusPerOp, usStr), orDash(r.WorkerCPUusPerOp, usStr), orDash(r.DelegateCPUusPerOp, usStr), orDash(r.ClientCPUusPerOp, usStr),
			orDash(float64(r.ServerRSSBytes), bytesStr), r.Errors)
	}
	fmt.Fprintln(w)
	printErrors(w, load)
}

// printIssue21 prints issue #21's table: p50 at the lowest concurrency,
// throughput at the highest, against the proxy.
func printIssue21(w io.Writer, lo, hi int, find func(sc, store string, c int) (LoadResult, bool), proxyLo, proxyHi LoadResult) {
	fmt.Fprintf(w, "| same run, loopback | p50 at concurrency %d | throughput at concurrency %d | server CPU/op at %d | server max RSS |\n", lo, hi, hi)
	fmt.Fprintln(w, "|---|--:|--:|--:|--:|")
	for _, row := range shippedRows {
		l, okL := find(row.scenario, row.store, lo)
		h, okH := find(row.scenario, row.store, hi)
		if !okL && !okH {
			continue
		}
		p50, tput := "–", "–"
		if okL {
			p50 = usStr(l.P50us)
			if proxyLo.P50us > 0 && row.scenario != "proc-direct" && row.scenario != "proc-proxy" {
				p50 += fmt.Sprintf(" (%s × proxy)", ratioStr(l.P50us/proxyLo.P50us))
			}
		}
		if okH {
			tput = fmt.Sprintf("%.0f/s", h.OpsPerSec)
			if proxyHi.OpsPerSec > 0 && row.scenario != "proc-direct" && row.scenario != "proc-proxy" {
				tput += fmt.Sprintf(" (%s × proxy)", ratioStr(h.OpsPerSec/proxyHi.OpsPerSec))
			}
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s |\n", row.label, p50, tput, orDash(h.ServerCPUusPerOp, usStr), orDash(float64(max(l.ServerRSSBytes, h.ServerRSSBytes)), bytesStr))
	}
	fmt.Fprintln(w)
}

// orDash is f(v), or "–" for 0: not measured, or no such process.
func orDash(v float64, f func(float64) string) string {
	if v == 0 {
		return "–"
	}
	return f(v)
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
		// Each run's own ratios, with today's targets (a file's are those
		// of the bench that wrote it, if any).
		r.Ratios = ratios(r.Load)
		r.Streaming = streamRows(r.Load)
	}
	out.Streaming = medianStreamRows(reps)
	for _, base := range reps[0].Ratios {
		vs := collect(reps, func(r *Report) []Ratio { return r.Ratios }, base.key(), Ratio.key)
		m := base
		m.Throughput = median(vs, func(v Ratio) float64 { return v.Throughput })
		m.P50 = median(vs, func(v Ratio) float64 { return v.P50 })
		m.P99 = median(vs, func(v Ratio) float64 { return v.P99 })
		m.CPU = median(vs, func(v Ratio) float64 { return v.CPU })
		m.ServerCPU = median(vs, func(v Ratio) float64 { return v.ServerCPU })
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
	r.ServerCPUusPerOp = median(vs, func(v LoadResult) float64 { return v.ServerCPUusPerOp })
	r.ServerRSSBytes = int64(median(vs, func(v LoadResult) float64 { return float64(v.ServerRSSBytes) }))
	r.WorkerCPUusPerOp = median(vs, func(v LoadResult) float64 { return v.WorkerCPUusPerOp })
	r.WorkerRSSBytes = int64(median(vs, func(v LoadResult) float64 { return float64(v.WorkerRSSBytes) }))
	r.DelegateCPUusPerOp = median(vs, func(v LoadResult) float64 { return v.DelegateCPUusPerOp })
	r.ClientCPUusPerOp = median(vs, func(v LoadResult) float64 { return v.ClientCPUusPerOp })
	r.TTFOP50us = median(vs, func(v LoadResult) float64 { return v.TTFOP50us })
	r.TTFOP99us = median(vs, func(v LoadResult) float64 { return v.TTFOP99us })
	r.TTLOP50us = median(vs, func(v LoadResult) float64 { return v.TTLOP50us })
	r.TTLOP99us = median(vs, func(v LoadResult) float64 { return v.TTLOP99us })
	r.OutputBytesPerOp = median(vs, func(v LoadResult) float64 { return v.OutputBytesPerOp })
	r.OutputMsgsPerOp = median(vs, func(v LoadResult) float64 { return v.OutputMsgsPerOp })
	r.OutputMsgsPerSec = median(vs, func(v LoadResult) float64 { return v.OutputMsgsPerSec })
	r.OverBound = int64(median(vs, func(v LoadResult) float64 { return float64(v.OverBound) }))
	r.StreamedCalls = int64(median(vs, func(v LoadResult) float64 { return float64(v.StreamedCalls) }))
	r.WindowBytes = int64(median(vs, func(v LoadResult) float64 { return float64(v.WindowBytes) }))
	r.ServerCPUusPerKB = median(vs, func(v LoadResult) float64 { return v.ServerCPUusPerKB })
	r.DelegateCPUusPerKB = median(vs, func(v LoadResult) float64 { return v.DelegateCPUusPerKB })
	if len(r.TTFOSplitP50us) > 0 {
		split := make([]float64, len(r.TTFOSplitP50us))
		for i := range split {
			split[i] = median(vs, func(v LoadResult) float64 {
				if i < len(v.TTFOSplitP50us) {
					return v.TTFOSplitP50us[i]
				}
				return 0
			})
		}
		r.TTFOSplitP50us = split
	}
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
