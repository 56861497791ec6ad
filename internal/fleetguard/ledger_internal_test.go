package fleetguard

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
)

// A ledger past maxGrants merges its oldest grants into one, counting
// every call still: the limit is never undercounted.
func TestLedgerMergesItsOldest(t *testing.T) {
	var l ledger
	for i := range maxGrants + 10 {
		l.G = append(l.G, grant{Sec: 1000 + int64(i%60), Replica: fmt.Sprint("r", i), Reqs: 1, Tokens: 2})
	}
	reqs, tokens := l.live(1059)
	assert.Len(t, l.G, maxGrants)
	assert.EqualValues(t, maxGrants+10, reqs)
	assert.EqualValues(t, 2*(maxGrants+10), tokens)
	// Grants age out after spanSecs.
	reqs, _ = l.live(1000 + spanSecs + 59)
	assert.Zero(t, reqs)
}
