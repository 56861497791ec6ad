package controls

import (
	"fmt"
	"math"
	"sync"
)

// Budgets throttles the retry control's retries per delegate, across runs,
// so that a delegate in trouble is not buried under retries. A nil Budgets
// (the default) never throttles.
type Budgets interface {
	// Allow reports whether a retry of the delegate may be scheduled now.
	// The retry control asks only when it is about to schedule one, so a
	// false answer is a suppressed retry.
	Allow(delegate string) bool
	// Record counts how a call to the delegate went: success for an
	// answer, !success for a transient failure. Other failures say nothing
	// about the delegate's load and are not recorded.
	Record(delegate string, success bool)
}

// Budget is one delegate's retry budget: gRPC's client retry throttling
// (retryThrottling in the service config, gRFC A6) as a token bucket. It
// starts full with maxTokens; every transient failure spends one token
// (never below 0), every success refills tokenRatio (never above
// maxTokens), and retries are allowed only while tokens > maxTokens/2. It is
// safe for concurrent use.
type Budget struct {
	mu         sync.Mutex
	maxTokens  float64
	ratio      float64
	tokens     float64
	suppressed int64
}

// newBudget returns a full budget. maxTokens and tokenRatio must be finite
// and greater than zero.
func newBudget(maxTokens, tokenRatio float64) (*Budget, error) {
	if err := checkBudget(maxTokens, tokenRatio); err != nil {
		return nil, err
	}
	return &Budget{maxTokens: maxTokens, ratio: tokenRatio, tokens: maxTokens}, nil
}

func checkBudget(maxTokens, tokenRatio float64) error {
	if !(maxTokens > 0) || math.IsInf(maxTokens, 0) {
		return fmt.Errorf("retry budget: max tokens must be a finite number above 0, got %v", maxTokens)
	}
	if !(tokenRatio > 0) || math.IsInf(tokenRatio, 0) {
		return fmt.Errorf("retry budget: token ratio must be a finite number above 0, got %v", tokenRatio)
	}
	return nil
}

// Allow reports whether tokens > maxTokens/2, and counts a suppressed retry
// when not.
func (b *Budget) Allow() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.tokens > b.maxTokens/2 {
		return true
	}
	b.suppressed++
	return false
}

// Record refills tokenRatio for a success and spends one token for a
// failure.
func (b *Budget) Record(success bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if success {
		b.tokens = min(b.maxTokens, b.tokens+b.ratio)
	} else {
		b.tokens = max(0, b.tokens-1)
	}
}

// Tokens returns the tokens left.
func (b *Budget) Tokens() float64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.tokens
}

// Suppressed returns how many retries Allow refused.
func (b *Budget) Suppressed() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.suppressed
}

// BudgetSet is a Budgets with one Budget per delegate, all with the same
// settings, each created full on first use. It is safe for concurrent use.
type BudgetSet struct {
	mu        sync.Mutex
	maxTokens float64
	ratio     float64
	budgets   map[string]*Budget
}

var _ Budgets = (*BudgetSet)(nil)

// NewBudgetSet returns a set whose budgets hold maxTokens and refill
// tokenRatio per success; both must be finite and greater than zero.
func NewBudgetSet(maxTokens, tokenRatio float64) (*BudgetSet, error) {
	if err := checkBudget(maxTokens, tokenRatio); err != nil {
		return nil, err
	}
	return &BudgetSet{maxTokens: maxTokens, ratio: tokenRatio, budgets: map[string]*Budget{}}, nil
}

// Budget returns the delegate's budget, creating it full if needed.
func (s *BudgetSet) Budget(delegate string) *Budget {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.budgets[delegate]
	if !ok {
		b = &Budget{maxTokens: s.maxTokens, ratio: s.ratio, tokens: s.maxTokens}
		s.budgets[delegate] = b
	}
	return b
}

// Allow asks the delegate's budget.
func (s *BudgetSet) Allow(delegate string) bool { return s.Budget(delegate).Allow() }

// Record counts a call's result in the delegate's budget.
func (s *BudgetSet) Record(delegate string, success bool) { s.Budget(delegate).Record(success) }
