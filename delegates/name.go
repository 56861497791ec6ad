package delegates

import (
	"errors"
	"fmt"
	"unicode"
	"unicode/utf8"
)

// MaxNameBytes bounds the name of a delegate or a preset, in bytes.
const MaxNameBytes = 128

// CheckName reports what is wrong with name as the name of a delegate or a
// preset, or nil: a name is 1 to MaxNameBytes bytes of UTF-8, each character
// a letter, mark, number, punctuation or symbol (unicode.IsPrint) — no
// whitespace, no control or format character. The config is held to it, and
// so is every name a request gives (server/validate.go), so a configured
// name can always be asked for, and a name asked for is short and prints as
// itself in messages and logs. The error never repeats name.
func CheckName(name string) error {
	switch {
	case name == "":
		return errors.New("must not be empty")
	case len(name) > MaxNameBytes:
		return fmt.Errorf("is %d bytes, more than the limit of %d", len(name), MaxNameBytes)
	case !utf8.ValidString(name):
		return errors.New("is not valid UTF-8")
	}
	for _, r := range name {
		if r == ' ' || !unicode.IsPrint(r) {
			return errors.New("must have no whitespace, control or format character")
		}
	}
	return nil
}
