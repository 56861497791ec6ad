package controls

import (
	"math/rand/v2"
	"time"
)

// backoff draws the full-jitter wait before retry n of a round (n = 1 for
// the first retry): uniform in [0, bound] with both ends included, where
// bound = backoffBound(n, base, maxWait). The cap is applied before the draw,
// so no wait ever exceeds maxWait (adding jitter after the cap is the flaw
// this avoids). A nil r uses math/rand/v2's randomly seeded global source.
func backoff(r *rand.Rand, n int, base, maxWait time.Duration) (wait, bound time.Duration) {
	bound = backoffBound(n, base, maxWait)
	if bound <= 0 {
		return 0, 0
	}
	// bound <= math.MaxInt64, so bound+1 fits in a uint64.
	span := uint64(bound) + 1
	if r == nil {
		return time.Duration(rand.Uint64N(span)), bound
	}
	return time.Duration(r.Uint64N(span)), bound
}

// backoffBound is min(maxWait, base·2^(n-1)), computed without overflow for
// any n. n below 1 counts as 1; a base or maxWait of zero or less gives 0.
func backoffBound(n int, base, maxWait time.Duration) time.Duration {
	if base <= 0 || maxWait <= 0 {
		return 0
	}
	shift := max(n, 1) - 1
	// base<<shift <= maxWait exactly when base <= maxWait>>shift, which is
	// checked without ever computing an overflowing product.
	if shift >= 63 || base > maxWait>>shift {
		return maxWait
	}
	return base << shift
}
