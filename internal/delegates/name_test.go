package delegates_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/stubbornhq/stubborn/internal/delegates"
)

func TestCheckName(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		in   string
		want string // "" means accepted
	}{
		{"ordinary", "search-backup_2", ""},
		{"punctuation and symbols", "team.a/echo:v2+x@1", ""},
		{"other scripts", "模型-ä", ""},
		{"at the limit", strings.Repeat("n", delegates.MaxNameBytes), ""},
		{"at the limit in multibyte letters", strings.Repeat("é", delegates.MaxNameBytes/2), ""},
		{"one byte over", strings.Repeat("n", delegates.MaxNameBytes+1), "is 129 bytes, more than the limit of 128"},
		{"multibyte over", strings.Repeat("é", delegates.MaxNameBytes/2) + "x", "is 129 bytes, more than the limit of 128"},
		{"empty", "", "must not be empty"},
		{"space", "my echo", "must have no whitespace"},
		{"tab", "a\tb", "must have no whitespace"},
		{"newline", "a\n", "must have no whitespace"},
		{"no-break space", "a\u00a0b", "must have no whitespace"},
		{"control", "a\x00b", "control"},
		{"zero-width joiner", "a\u200db", "format character"},
		{"bidi override", "a\u202eb", "format character"},
		{"invalid UTF-8", "a\xffb", "is not valid UTF-8"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := delegates.CheckName(tt.in)
			if tt.want == "" {
				assert.NoError(t, err)
				return
			}
			if assert.Error(t, err) {
				assert.Contains(t, err.Error(), tt.want)
				if len(tt.in) > 1 {
					assert.NotContains(t, err.Error(), tt.in, "the error does not repeat the name")
				}
			}
		})
	}
}

// Closest guesses the name meant: within a third of its length and 2
// edits, a swap of two neighbours counting one; nothing when none is
// that close.
func TestClosest(t *testing.T) {
	names := []string{"echo", "control", "idempotent", "read_only", "delegates"}
	for s, want := range map[string]string{
		"ecoh":       "echo",
		"contrl":     "control",
		"idempotant": "idempotent",
		"readonly":   "read_only",
		"delegate":   "delegates",
		"ech":        "echo", // 3 letters: 1 edit
		"ec":         "",     // 2 letters: none
		"colour":     "",
		"":           "",
	} {
		assert.Equal(t, want, delegates.Closest(s, names), "%q", s)
	}
	assert.Equal(t, 1, delegates.EditDistance("ecoh", "echo"))
	assert.Equal(t, 3, delegates.EditDistance("", "abc"))
}
