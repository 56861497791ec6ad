package doccheck_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/stubbornhq/stubborn/internal/doccheck"
)

const guide = "# Guide\n" + // 1
	"\n" + // 2
	"```sh\n" + // 3
	"echo one\n" + // 4
	"```\n" + // 5
	"<!-- not run: needs a GPU -->\n" + // 6
	"```sh\n" + // 7
	"nvidia-smi\n" + // 8
	"```\n" + // 9
	"```console\n" + // 10
	"$ echo one\n" + // 11
	"one\n" + // 12
	"```\n" + // 13
	"- a list item:\n" + // 14
	"  ```sh title=x\n" + // 15
	"  echo two\n" + // 16
	"    indented\n" + // 17
	"  ```\n" + // 18
	"````md\n" + // 19
	"```sh\n" + // 20
	"not a block of its own\n" + // 21
	"```\n" + // 22
	"````\n" // 23

func TestParseBlocks(t *testing.T) {
	blocks := doccheck.ParseBlocks("guide.md", []byte(guide))
	require.Len(t, blocks, 5)
	assert.Equal(t, doccheck.Block{File: "guide.md", Line: 3, Lang: "sh", Body: "echo one\n"}, blocks[0])
	assert.True(t, blocks[0].Runnable())
	assert.Equal(t, "needs a GPU", blocks[1].NotRun)
	assert.False(t, blocks[1].Runnable(), "a marked block is not run")
	assert.Equal(t, "console", blocks[2].Lang)
	assert.False(t, blocks[2].Runnable(), "output is not run")
	assert.Equal(t, doccheck.Block{File: "guide.md", Line: 15, Lang: "sh", Body: "echo two\n  indented\n"}, blocks[3], "a list item's block loses the fence's indentation")
	assert.Equal(t, "md", blocks[4].Lang, "a longer fence holds a shorter one")
	assert.Equal(t, "guide.md:15", blocks[3].String())
	assert.Empty(t, doccheck.CheckConventions(blocks))
}

func TestCheckConventions(t *testing.T) {
	for _, tc := range []struct {
		name, md, want string
	}{
		{"bash fence", "```bash\nls\n```\n", "guide.md:1: a ```bash block: fence shell commands ```sh"},
		{"shell fence", "text\n```shell\nls\n```\n", "guide.md:2: a ```shell block"},
		{"marker without a reason", "<!-- not run: -->\n```sh\nls\n```\n", `guide.md:2: the marker "<!-- not run: -->" needs a reason`},
		{"marker misspelt", "<!-- not-run because -->\n```sh\nls\n```\n", "needs a reason"},
		{"shell without a language", "```\n# build it\n\ngo build ./cmd/stubborn\n```\n", "guide.md:1: a block with no language that looks like shell commands"},
		{"a prompt without a language", "```\n$ ./stubborn list\n```\n", "looks like shell commands"},
		{"marker on output", "<!-- not run: output -->\n```console\nls\n```\n", "a not-run marker on a ```console block"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs := doccheck.CheckConventions(doccheck.ParseBlocks("guide.md", []byte(tc.md)))
			require.Len(t, errs, 1)
			assert.Contains(t, errs[0].Error(), tc.want)
		})
	}
	// A diagram or a log is no shell.
	assert.Empty(t, doccheck.CheckConventions(doccheck.ParseBlocks("g.md", []byte("```\ncmd/stubborn ──► server\n```\n```\ngo-routines: 5\n```\n"))))
	// A marked block's reason is kept whatever its spacing.
	b := doccheck.ParseBlocks("g.md", []byte("  <!--not run:   a server that runs until Ctrl-C   -->\n```sh\nx\n```\n"))
	require.Len(t, b, 1)
	assert.Equal(t, "a server that runs until Ctrl-C", b[0].NotRun)
	// A marker two lines up is no marker: it must sit right before the fence.
	b = doccheck.ParseBlocks("g.md", []byte("<!-- not run: far -->\n\n```sh\nx\n```\n"))
	assert.True(t, b[0].Runnable())
	assert.False(t, strings.Contains(b[0].Body, "not run"))
}
