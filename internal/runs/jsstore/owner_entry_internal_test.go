package jsstore

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestOwnerEntries(t *testing.T) {
	for _, c := range []struct {
		owner string
		state []byte
	}{{"a", []byte("state")}, {"stubborn-x1", nil}, {"", []byte{0, 1, 2}}} {
		owner, state := parseOwnerEntry(ownerEntry(c.owner, c.state))
		assert.Equal(t, c.owner, owner)
		assert.Equal(t, string(c.state), string(state))
	}
	owner, state := parseOwnerEntry([]byte("stubborn-old"))
	assert.Equal(t, "stubborn-old", owner, "an older server's entry is a name alone")
	assert.Nil(t, state)
	owner, state = parseOwnerEntry([]byte{ownerMark, 9, 'a'})
	assert.Empty(t, owner+string(state), "a truncated entry reads as no owner")
}
