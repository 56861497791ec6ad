package controls_test

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stubbornhq/stubborn/internal/controls"
)

// The full-jitter property: over many seeds, every wait before retry n lies
// in [0, min(max_wait, base·2^(n-1))], none exceeds max_wait, and the waits'
// mean is close to half the bound.
func TestBackoffFullJitterProperty(t *testing.T) {
	t.Parallel()
	const (
		seeds   = 1000
		base    = time.Second
		maxWait = 60 * time.Second
	)
	for n := 1; n <= 12; n++ {
		want := min(maxWait, base<<(n-1))
		var sum float64
		for seed := range uint64(seeds) {
			r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
			wait, bound := controls.Backoff(r, n, base, maxWait)
			if bound != want {
				t.Fatalf("n=%d seed=%d: bound %v, want %v", n, seed, bound, want)
			}
			if wait < 0 || wait > bound || wait > maxWait {
				t.Fatalf("n=%d seed=%d: wait %v outside [0, %v] (max_wait %v)", n, seed, wait, bound, maxWait)
			}
			sum += float64(wait)
		}
		// The mean of a uniform [0, b] is b/2 with a standard deviation of
		// b/sqrt(12); over 1000 draws the mean's deviation is about 0.009·b,
		// so 0.05·b is more than five of them.
		mean, half := sum/seeds, float64(want)/2
		if math.Abs(mean-half) > 0.05*float64(want) {
			t.Errorf("n=%d: mean wait %v, want close to %v", n, time.Duration(mean), time.Duration(half))
		}
	}
}

func TestBackoffBoundEdges(t *testing.T) {
	t.Parallel()
	const maxDuration = time.Duration(math.MaxInt64)
	tests := []struct {
		name          string
		n             int
		base, maxWait time.Duration
		want          time.Duration
	}{
		{"first retry waits up to base", 1, time.Second, time.Minute, time.Second},
		{"doubles per retry", 4, time.Second, time.Minute, 8 * time.Second},
		{"capped by max_wait", 7, time.Second, time.Minute, time.Minute},
		{"n below 1 counts as 1", 0, time.Second, time.Minute, time.Second},
		{"negative n counts as 1", -5, time.Second, time.Minute, time.Second},
		{"base above max_wait", 1, time.Hour, time.Minute, time.Minute},
		{"zero base", 3, 0, time.Minute, 0},
		{"zero max_wait", 3, time.Second, 0, 0},
		{"n=62 with a tiny base", 62, 1, maxDuration, 1 << 61},
		{"n=63 with a tiny base", 63, 1, maxDuration, 1 << 62},
		{"n=64 would overflow", 64, 1, maxDuration, maxDuration},
		{"n=65 would shift out", 65, time.Second, time.Minute, time.Minute},
		{"huge n", math.MaxInt, time.Second, time.Minute, time.Minute},
		{"huge n and max_wait", math.MaxInt, time.Second, maxDuration, maxDuration},
		{"just under overflow", 34, time.Second, maxDuration, time.Second << 33},
		{"just over overflow", 35, time.Second, maxDuration, maxDuration},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := controls.BackoffBound(tt.n, tt.base, tt.maxWait); got != tt.want {
				t.Errorf("BackoffBound(%d, %v, %v) = %v, want %v", tt.n, tt.base, tt.maxWait, got, tt.want)
			}
			r := rand.New(rand.NewPCG(1, 2))
			for range 100 {
				wait, bound := controls.Backoff(r, tt.n, tt.base, tt.maxWait)
				if bound != tt.want || wait < 0 || wait > bound {
					t.Fatalf("Backoff(%d, %v, %v) = %v, %v; want a wait in [0, %v]", tt.n, tt.base, tt.maxWait, wait, bound, tt.want)
				}
			}
		})
	}
}

// Both ends of [0, bound] are drawn: the range is inclusive.
func TestBackoffInclusiveRange(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(7, 7))
	seen := map[time.Duration]bool{}
	for range 200 {
		wait, _ := controls.Backoff(r, 1, 1, time.Second) // bound 1ns
		seen[wait] = true
	}
	if !seen[0] || !seen[1] || len(seen) != 2 {
		t.Errorf("waits drawn from [0, 1ns]: %v, want both 0 and 1ns", seen)
	}
}

// A nil source uses the global, randomly seeded one.
func TestBackoffNilRand(t *testing.T) {
	t.Parallel()
	for n := 1; n <= 70; n++ {
		wait, bound := controls.Backoff(nil, n, time.Second, time.Minute)
		if wait < 0 || wait > bound || bound > time.Minute {
			t.Fatalf("n=%d: wait %v, bound %v", n, wait, bound)
		}
	}
}

// The same seed gives the same waits: tests can rely on it.
func TestBackoffDeterministic(t *testing.T) {
	t.Parallel()
	a, b := rand.New(rand.NewPCG(3, 4)), rand.New(rand.NewPCG(3, 4))
	for n := 1; n <= 10; n++ {
		wa, _ := controls.Backoff(a, n, time.Second, time.Minute)
		wb, _ := controls.Backoff(b, n, time.Second, time.Minute)
		if wa != wb {
			t.Fatalf("n=%d: %v != %v with the same seed", n, wa, wb)
		}
	}
}
