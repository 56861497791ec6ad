package delegates

import (
	"context"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/stubbornhq/stubborn/internal/fleetguard/fleetguardtest"
)

// BenchmarkAdmit measures what the guards add to a call (Admit and its
// end), per replica and fleet-wide on a 3-node nats-server cluster: the
// p50 and this process's CPU per call (the NATS servers' apart). The
// delegate has a circuit breaker and a requests_per_minute high enough
// that no call is refused, so the fleet's leases are 100 calls.
//
//	go test -run '^$' -bench Admit -benchtime 20000x ./internal/delegates/
func BenchmarkAdmit(b *testing.B) {
	for _, tc := range []struct {
		name string
		d    Delegate
	}{
		{"breaker", Delegate{Name: "d", CircuitBreaker: &CircuitBreaker{ConsecutiveFailures: 5}}},
		{"breaker+rpm", Delegate{Name: "d", CircuitBreaker: &CircuitBreaker{ConsecutiveFailures: 5}, RequestsPerMinute: 1_000_000}},
	} {
		b.Run(tc.name+"/local", func(b *testing.B) {
			g := NewGuards(nil)
			g.Configure(&Config{Delegates: []Delegate{tc.d}})
			benchAdmit(b, g)
		})
		b.Run(tc.name+"/fleet", func(b *testing.B) {
			c := fleetguardtest.StartCluster(b)
			g := NewGuards(nil)
			g.Configure(&Config{Delegates: []Delegate{tc.d}})
			g.UseFleet(c.Fleet(b, "bench-"+tc.name))
			benchAdmit(b, g)
		})
	}
}

func benchAdmit(b *testing.B, g *Guards) {
	ctx := context.Background()
	took := make([]time.Duration, 0, b.N)
	cpu0 := cpuTime()
	b.ResetTimer()
	for b.Loop() {
		start := time.Now()
		done, err := g.Admit(ctx, "d")
		if err != nil {
			b.Fatal(err)
		}
		done(nil, nil)
		took = append(took, time.Since(start))
	}
	b.StopTimer()
	cpu := cpuTime() - cpu0
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2].Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(took[len(took)*99/100].Nanoseconds()), "p99-ns")
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(len(took)), "cpu-ns/call")
}

// cpuTime is this process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
