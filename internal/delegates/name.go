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

// Closest returns the candidate nearest to s, for a "did you mean": one
// within an edit distance of a third of s's length and at most 2 (see
// editDistance), the first of the nearest; "" when none is that close.
func Closest(s string, candidates []string) string {
	best, bestD := "", min(2, len(s)/3)+1
	for _, c := range candidates {
		if d := editDistance(s, c); d < bestD {
			best, bestD = c, d
		}
	}
	return best
}

// editDistance is the distance of a and b in edits of a byte (insert,
// delete, replace, or swap two neighbours: "ecoh" is 1 from "echo"; the
// optimal string alignment distance). It takes time len(a)×len(b): for
// names and keys, which are short.
func editDistance(a, b string) int {
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}
