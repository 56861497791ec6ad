package runs

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestBatchLenBoundsCountAndBytes(t *testing.T) {
	ev := func(size int) Event { return Event{Data: make([]byte, size)} }
	small := []Event{ev(10), ev(10), ev(10), ev(10)}
	assert.Equal(t, 3, batchLen(small, 3))
	assert.Equal(t, 4, batchLen(small, 100))
	assert.Equal(t, 1, batchLen(small, 1))
	big := []Event{ev(maxBatchBytes / 2), ev(maxBatchBytes / 2), ev(1)}
	assert.Equal(t, 2, batchLen(big, 100), "up to maxBatchBytes")
	huge := []Event{ev(maxBatchBytes + 1), ev(1)}
	assert.Equal(t, 1, batchLen(huge, 100), "an event larger than the bound comes alone")
}
