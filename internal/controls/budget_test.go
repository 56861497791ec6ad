package controls_test

import (
	"math"
	"sync"
	"testing"

	"github.com/stubbornhq/stubborn/internal/controls"
)

func TestNewBudgetRejectsBadSettings(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ maxTokens, ratio float64 }{
		{0, 1}, {-1, 1}, {math.NaN(), 1}, {math.Inf(1), 1},
		{10, 0}, {10, -0.1}, {10, math.NaN()}, {10, math.Inf(1)},
	} {
		if _, err := controls.NewBudget(tt.maxTokens, tt.ratio); err == nil {
			t.Errorf("NewBudget(%v, %v): no error", tt.maxTokens, tt.ratio)
		}
		if _, err := controls.NewBudgetSet(tt.maxTokens, tt.ratio); err == nil {
			t.Errorf("NewBudgetSet(%v, %v): no error", tt.maxTokens, tt.ratio)
		}
	}
}

// The token bucket of gRPC's retryThrottling: full at start, one token per
// failure, tokenRatio back per success, retries only above half.
func TestBudgetTokenBucket(t *testing.T) {
	t.Parallel()
	b, err := controls.NewBudget(4, 0.5)
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		success bool
		tokens  float64
		allow   bool
	}{
		{false, 3, true},   // 3 > 2
		{false, 2, false},  // 2 is not above half
		{false, 1, false},  //
		{false, 0, false},  //
		{false, 0, false},  // never below 0
		{true, 0.5, false}, //
		{true, 1, false},   //
		{true, 1.5, false}, //
		{true, 2, false},   //
		{true, 2.5, true},  // above half again
		{true, 3, true},    //
		{true, 3.5, true},  //
		{true, 4, true},    //
		{true, 4, true},    // never above maxTokens
	}
	for i, s := range steps {
		b.Record(s.success)
		if got := b.Tokens(); got != s.tokens {
			t.Fatalf("step %d: tokens %v, want %v", i, got, s.tokens)
		}
		if got := b.Allow(); got != s.allow {
			t.Fatalf("step %d: Allow() = %v with %v tokens, want %v", i, got, s.tokens, s.allow)
		}
	}
	if got := b.Suppressed(); got != 8 {
		t.Errorf("Suppressed() = %d, want 8 (one per refused Allow)", got)
	}
}

func TestBudgetSetIsPerDelegate(t *testing.T) {
	t.Parallel()
	s, err := controls.NewBudgetSet(2, 1)
	if err != nil {
		t.Fatal(err)
	}
	s.Record("a", false) // 1 token: not above half of 2
	if s.Allow("a") {
		t.Error("a: allowed at half its tokens")
	}
	if !s.Allow("b") {
		t.Error("b: refused, but only a failed")
	}
	if s.Budget("a") != s.Budget("a") {
		t.Error("Budget returns a new budget each time")
	}
	if got := s.Budget("a").Suppressed(); got != 1 {
		t.Errorf("a suppressed %d, want 1", got)
	}
}

// Run with -race: budgets are shared by every run of the server.
func TestBudgetSetConcurrent(t *testing.T) {
	t.Parallel()
	s, err := controls.NewBudgetSet(1000, 1)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for g := range 50 {
		wg.Go(func() {
			for i := range 100 {
				s.Record("d", (g+i)%2 == 0)
				s.Allow("d")
			}
		})
	}
	wg.Wait()
	// Whatever the interleaving, the bucket stays within its bounds.
	if got := s.Budget("d").Tokens(); got < 0 || got > 1000 {
		t.Errorf("tokens %v outside [0, 1000]", got)
	}
}
