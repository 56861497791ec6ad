package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
)

// The targets the ratios are judged by: throughput at the highest
// concurrency (at least), p50 at the lowest (at most).
const (
	// Issue #8, in process: run ÷ proxy.
	targetRunThroughput = 0.8
	targetRunP50        = 1.3
	// Issue #21, shipped: `stubborn serve -memory` ÷ the plain proxy, and
	// its stretch goals.
	targetShippedThroughput, stretchShippedThroughput = 0.6, 0.8
	targetShippedP50, stretchShippedP50               = 1.5, 1.3
	// Issue #21: the default `stubborn serve` ÷ -memory.
	targetDurableThroughput = 0.7
	targetDurableP50        = 1.3
	// Issue #21: the default `stubborn serve` ÷ Temporal, one attempt: 30 ×
	// lower p50 and 75 × the throughput.
	targetTemporalThroughput = 75
	targetTemporalP50        = 1.0 / 30
)

// Ratio compares two measurements at one concurrency: A's figure over B's.
type Ratio struct {
	Label string `json:"label"`
	Store string `json:"store"`
	// Group is "shipped" for the shipped scenarios' ratios, empty for the
	// in-process ones'.
	Group       string  `json:"group,omitempty"`
	Concurrency int     `json:"concurrency"`
	Throughput  float64 `json:"throughput"`
	P50         float64 `json:"p50"`
	P99         float64 `json:"p99"`
	// CPU is the CPU time per call of every process of each side (the
	// client's, the server's, the delegate's); ServerCPU, for the shipped
	// scenarios, the server process's alone (the proxy, `stubborn serve`).
	CPU       float64 `json:"cpu_per_op"`
	ServerCPU float64 `json:"server_cpu_per_op,omitempty"`
	// The targets this row is judged by, 0 for none; Stretch the issue's
	// stretch goal.
	ThroughputAtLeast float64 `json:"throughput_at_least,omitempty"`
	ThroughputStretch float64 `json:"throughput_stretch,omitempty"`
	P50AtMost         float64 `json:"p50_at_most,omitempty"`
	P50Stretch        float64 `json:"p50_stretch,omitempty"`
}

func (r Ratio) key() string { return fmt.Sprintf("%s|%s|%d", r.Label, r.Store, r.Concurrency) }

// side is one side of a ratio: a scenario on a store ("" for a scenario
// without one).
type side struct{ scenario, store string }

// ratioPair is a ratio of a over b, computed at every concurrency, and its
// targets (0: none).
type ratioPair struct {
	label, store, group                            string
	a, b                                           side
	throughput, throughputStretch, p50, p50Stretch float64
}

// ratioPairs lists the ratios of the stores in load. In process, for each
// store: 3/2 (run ÷ proxy), 4/1 (retry ÷ direct), 3/2b, 2b/2, 3/2c and 2c/2.
// Shipped, for each store: proc-run ÷ proc-proxy, proc-retry ÷
// proc-direct, proc-run ÷ proc-run on memory, and ÷ the Temporal peer.
func ratioPairs(load []LoadResult) []ratioPair {
	var inStores, procStores []string
	for _, r := range load {
		switch {
		case r.Store == "":
		case isShipped(r.Scenario):
			if !slices.Contains(procStores, r.Store) {
				procStores = append(procStores, r.Store)
			}
		case !slices.Contains(inStores, r.Store):
			inStores = append(inStores, r.Store)
		}
	}
	var out []ratioPair
	for _, store := range inStores {
		storeOf := func(sc string) string {
			if sc == "run" || sc == "retry" {
				return store
			}
			return ""
		}
		for _, p := range []struct{ a, b, label string }{
			{"run", "proxy", "3/2 run ÷ proxy"}, {"retry", "direct", "4/1 retry ÷ direct"},
			{"run", "stream", "3/2b run ÷ stream"}, {"stream", "proxy", "2b/2 stream ÷ proxy"},
			{"run", "stream-live", "3/2c run ÷ stream-live"}, {"stream-live", "proxy", "2c/2 stream-live ÷ proxy"},
		} {
			rp := ratioPair{label: p.label, store: store, a: side{p.a, storeOf(p.a)}, b: side{p.b, storeOf(p.b)}}
			if p.label == "3/2 run ÷ proxy" {
				rp.throughput, rp.p50 = targetRunThroughput, targetRunP50
			}
			out = append(out, rp)
		}
	}
	for _, store := range procStores {
		run, retry := side{"proc-run", store}, side{"proc-retry", store}
		pairs := []ratioPair{
			{label: "proc-run ÷ proc-proxy", a: run, b: side{"proc-proxy", ""}},
			{label: "proc-retry ÷ proc-direct", a: retry, b: side{"proc-direct", ""}},
		}
		if store == "memory" {
			pairs[0].throughput, pairs[0].throughputStretch = targetShippedThroughput, stretchShippedThroughput
			pairs[0].p50, pairs[0].p50Stretch = targetShippedP50, stretchShippedP50
		} else {
			p := ratioPair{label: "proc-run ÷ proc-run memory", a: run, b: side{"proc-run", "memory"}}
			if store == "embedded-interval" {
				p.throughput, p.p50 = targetDurableThroughput, targetDurableP50
			}
			pairs = append(pairs, p)
		}
		t := ratioPair{label: "proc-run ÷ temporal-one", a: run, b: side{"temporal-one", ""}}
		if store == "embedded-interval" {
			t.throughput, t.p50 = targetTemporalThroughput, targetTemporalP50
		}
		pairs = append(pairs, t, ratioPair{label: "proc-retry ÷ temporal-retry3", a: retry, b: side{"temporal-retry3", ""}})
		for _, p := range pairs {
			p.store, p.group = store, "shipped"
			out = append(out, p)
		}
	}
	return out
}

// ratios computes ratioPairs' ratios at every concurrency of one run.
func ratios(load []LoadResult) []Ratio {
	find := func(s side, c int) (LoadResult, bool) {
		for _, r := range load {
			if r.Scenario == s.scenario && r.Store == s.store && r.Concurrency == c {
				return r, true
			}
		}
		return LoadResult{}, false
	}
	var concs []int
	for _, r := range load {
		if !slices.Contains(concs, r.Concurrency) {
			concs = append(concs, r.Concurrency)
		}
	}
	slices.Sort(concs)
	if len(concs) == 0 {
		return nil
	}
	lo, hi := concs[0], concs[len(concs)-1]
	var out []Ratio
	for _, p := range ratioPairs(load) {
		for _, c := range concs {
			a, okA := find(p.a, c)
			b, okB := find(p.b, c)
			if !okA || !okB || b.OpsPerSec == 0 || b.P50us == 0 || b.P99us == 0 {
				continue
			}
			r := Ratio{
				Label: p.label, Store: p.store, Group: p.group, Concurrency: c,
				Throughput: a.OpsPerSec / b.OpsPerSec, P50: a.P50us / b.P50us, P99: a.P99us / b.P99us,
			}
			if b.CPUusPerOp > 0 {
				r.CPU = a.CPUusPerOp / b.CPUusPerOp
			}
			if b.ServerCPUusPerOp > 0 {
				r.ServerCPU = a.ServerCPUusPerOp / b.ServerCPUusPerOp
			}
			if c == hi {
				r.ThroughputAtLeast, r.ThroughputStretch = p.throughput, p.throughputStretch
			}
			if c == lo {
				r.P50AtMost, r.P50Stretch = p.p50, p.p50Stretch
			}
			out = append(out, r)
		}
	}
	return out
}

// printRatios prints the ratios, in-process and shipped apart, and the
// verdicts on their targets.
func printRatios(w io.Writer, rs []Ratio, what string) {
	for _, g := range []struct{ group, title string }{{"", "Ratios"}, {"shipped", "Shipped binary: ratios"}} {
		group := slices.DeleteFunc(slices.Clone(rs), func(r Ratio) bool { return r.Group != g.group })
		if len(group) == 0 {
			continue
		}
		fmt.Fprintf(w, "### %s (%s)\n\n", g.title, what)
		fmt.Fprintln(w, "| ratio | store | concurrency | throughput | p50 | p99 | CPU/op all | CPU/op server | target |")
		fmt.Fprintln(w, "|---|---|--:|--:|--:|--:|--:|--:|---|")
		for _, r := range group {
			var targets []string
			if r.ThroughputAtLeast > 0 {
				targets = append(targets, judge("throughput", "≥", r.Throughput, r.ThroughputAtLeast, r.ThroughputStretch))
			}
			if r.P50AtMost > 0 {
				targets = append(targets, judge("p50", "≤", r.P50, r.P50AtMost, r.P50Stretch))
			}
			target := "–"
			if len(targets) > 0 {
				target = strings.Join(targets, "; ")
			}
			fmt.Fprintf(w, "| %s | %s | %d | %s | %s | %s | %s | %s | %s |\n", r.Label, r.Store, r.Concurrency,
				ratioStr(r.Throughput), ratioStr(r.P50), ratioStr(r.P99), ratioStr(r.CPU), orDash(r.ServerCPU, ratioStr), target)
		}
		fmt.Fprintln(w)
	}
}

// judge says whether v meets a target of op ("≥" or "≤") limit, and its
// stretch goal (0: none).
func judge(name, op string, v, limit, stretch float64) string {
	meets := func(l float64) bool {
		if op == "≥" {
			return v >= l
		}
		return v <= l
	}
	s := fmt.Sprintf("%s %s %s", name, op, ratioStr(limit))
	if stretch == 0 {
		return s + ": " + verdict(meets(limit))
	}
	s += fmt.Sprintf(" (stretch %s): ", ratioStr(stretch))
	if meets(stretch) {
		return s + "stretch met"
	}
	return s + verdict(meets(limit))
}

// ratioStr prints a ratio with two decimals, or the digits it needs far
// from 1 (Stubborn ÷ Temporal).
func ratioStr(v float64) string {
	switch {
	case v == 0:
		return "–"
	case v < 0.1:
		return fmt.Sprintf("%.4f", v)
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.2f", v)
}
