// Package doccheck keeps the user docs true: it finds the shell blocks of
// the README and docs/ and runs them (see [Runner]), and compares the
// configuration reference with the keys the config parser takes (see
// [ParserKeys] and [DocumentedKeys]).
//
// The docs' conventions it enforces:
//
//   - A block a user would paste into a shell is fenced ```sh (```console
//     for output). Every ```sh block is run, unless the line right before
//     its opening fence is `<!-- not run: REASON -->` with a REASON.
//     A ```bash, ```shell or ```zsh block is refused: it would escape the
//     run, so it must say sh; so is a block with no language whose first
//     line reads like a shell command (./stubborn, go, make, curl, $ …).
//   - docs/configuration.md documents each config key in a table row whose
//     first cell is the key's full dotted path in backticks, `[]` marking a
//     list's entries: `delegates[].openai.base_url`.
package doccheck

import (
	"fmt"
	"regexp"
	"strings"
)

// Block is a fenced code block of a markdown file.
type Block struct {
	// File is the markdown file's path, as given to [ParseBlocks].
	File string
	// Line is the 1-based line of the opening fence.
	Line int
	// Lang is the first word of the fence's info string ("sh"), or "".
	Lang string
	// Body is the block's content, its indentation (that of the fence)
	// removed, ending with a newline unless empty.
	Body string
	// NotRun is the reason of the `<!-- not run: REASON -->` on the line
	// before the fence; "" when there is none.
	NotRun string
	// Marker is that line when it is an HTML comment that starts with
	// "not run" (well-formed or not), else "".
	Marker string
}

// String names the block as an editor jumps to it: README.md:54.
func (b Block) String() string { return fmt.Sprintf("%s:%d", b.File, b.Line) }

// Runnable says whether CI runs the block.
func (b Block) Runnable() bool { return b.Lang == "sh" && b.NotRun == "" }

var (
	fenceOpen = regexp.MustCompile("^( *)(`{3,}|~{3,})(.*)$")
	// notRun is the marker; its reason is what follows the colon.
	notRun = regexp.MustCompile(`^<!--\s*not run:(.*?)-->$`)
	// markerLike is a comment meant as the marker, to refuse a malformed one.
	markerLike = regexp.MustCompile(`^<!--\s*not[ -]?run`)
)

// shellLangs are info strings of shell blocks that are not sh: the
// convention has one, so that no shell block escapes the run.
var shellLangs = map[string]bool{"bash": true, "shell": true, "zsh": true, "shell-session": true, "sh-session": true, "console-session": true}

// shellStart matches the first line of a block a user would paste into a
// shell, to find one left without a language.
var shellStart = regexp.MustCompile(`^(\$ |\./|(go|make|curl|git|grpcurl|npm|npx|bash|cd|export|docker|stubborn|pip|python3?)( |$))`)

// looksLikeShell says whether body's first line that is not blank and no
// comment starts like a shell command.
func looksLikeShell(body string) bool {
	for _, l := range strings.Split(body, "\n") {
		l = strings.TrimSpace(l)
		if l != "" && !strings.HasPrefix(l, "#") {
			return shellStart.MatchString(l)
		}
	}
	return false
}

// ParseBlocks returns the fenced code blocks of the markdown src, read from
// file (which names them). A fence left open runs to the end of the file,
// as CommonMark reads it.
func ParseBlocks(file string, src []byte) []Block {
	lines := strings.Split(string(src), "\n")
	var blocks []Block
	for i := 0; i < len(lines); i++ {
		m := fenceOpen.FindStringSubmatch(strings.TrimRight(lines[i], " \t\r"))
		if m == nil || (m[2][0] == '`' && strings.Contains(m[3], "`")) {
			continue
		}
		indent, fence, info := len(m[1]), m[2], strings.TrimSpace(m[3])
		b := Block{File: file, Line: i + 1}
		if f := strings.Fields(info); len(f) > 0 {
			b.Lang = strings.ToLower(f[0])
		}
		if i > 0 {
			prev := strings.TrimSpace(lines[i-1])
			if markerLike.MatchString(prev) {
				b.Marker = prev
				if r := notRun.FindStringSubmatch(prev); r != nil {
					b.NotRun = strings.TrimSpace(r[1])
				}
			}
		}
		var body strings.Builder
		j := i + 1
		for ; j < len(lines); j++ {
			l := strings.TrimRight(lines[j], "\r")
			t := strings.TrimLeft(l, " ")
			if strings.HasPrefix(t, fence[:1]) && strings.Trim(strings.TrimSpace(t), fence[:1]) == "" && len(strings.TrimSpace(t)) >= len(fence) {
				break
			}
			// Remove up to the fence's indentation, as CommonMark does.
			k := 0
			for k < indent && k < len(l) && l[k] == ' ' {
				k++
			}
			body.WriteString(l[k:])
			body.WriteByte('\n')
		}
		b.Body = body.String()
		blocks = append(blocks, b)
		i = j
	}
	return blocks
}

// CheckConventions returns what is wrong with the blocks' fences and
// markers, each error naming the block: a shell block not fenced sh, a
// marker without a reason, or a marker on a block that is never run.
func CheckConventions(blocks []Block) []error {
	var errs []error
	for _, b := range blocks {
		switch {
		case shellLangs[b.Lang]:
			errs = append(errs, fmt.Errorf("%s: a ```%s block: fence shell commands ```sh (run by CI, or marked <!-- not run: REASON -->), output ```console", b, b.Lang))
		case b.Lang == "" && looksLikeShell(b.Body):
			errs = append(errs, fmt.Errorf("%s: a block with no language that looks like shell commands: fence it ```sh (run by CI, or marked <!-- not run: REASON -->), or ```console for output", b))
		case b.Marker != "" && b.NotRun == "":
			errs = append(errs, fmt.Errorf("%s: the marker %q needs a reason: <!-- not run: REASON -->", b, b.Marker))
		case b.Marker != "" && b.Lang != "sh":
			errs = append(errs, fmt.Errorf("%s: a not-run marker on a ```%s block, which is never run: it belongs before ```sh blocks only", b, b.Lang))
		}
	}
	return errs
}
