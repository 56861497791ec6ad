//go:build linux

package doccheck_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/stubbornhq/stubborn/internal/doccheck"
)

// The tests in this file check the repository's own docs: README.md and
// the markdown under docs/.

// BlockTimeout bounds each shell block of the docs, unless
// STUBBORN_DOCS_BLOCK_TIMEOUT (a Go duration) says otherwise: shorter, to
// find quickly which blocks fail.
const BlockTimeout = 3 * time.Minute

func blockTimeout(t *testing.T) time.Duration {
	v := os.Getenv("STUBBORN_DOCS_BLOCK_TIMEOUT")
	if v == "" {
		return BlockTimeout
	}
	d, err := time.ParseDuration(v)
	require.NoError(t, err, "STUBBORN_DOCS_BLOCK_TIMEOUT")
	require.Positive(t, d, "STUBBORN_DOCS_BLOCK_TIMEOUT")
	return d
}

// repoRoot is the repository this package is in.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	mod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(string(mod), "module github.com/stubbornhq/stubborn\n"), "%s is not the repository's root", root)
	return root
}

// docBlocks returns the fenced blocks of README.md and docs/**/*.md.
func docBlocks(t *testing.T, root string) []doccheck.Block {
	t.Helper()
	files := []string{"README.md"}
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(path string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(path, ".md") {
			rel, err := filepath.Rel(root, path)
			files = append(files, rel)
			return err
		}
		return err
	})
	require.NoError(t, err)
	var blocks []doccheck.Block
	for _, f := range files {
		src, err := os.ReadFile(filepath.Join(root, f))
		require.NoError(t, err)
		blocks = append(blocks, doccheck.ParseBlocks(f, src)...)
	}
	return blocks
}

// TestDocsConventions: every shell block of the docs is fenced sh, and
// every not-run marker says why.
func TestDocsConventions(t *testing.T) {
	for _, err := range doccheck.CheckConventions(docBlocks(t, repoRoot(t))) {
		t.Error(err)
	}
}

// TestDocsShellBlocks runs every ```sh block of the docs not marked
// `<!-- not run: REASON -->`, one at a time, each in a fresh copy of the
// repository with ./stubborn built, under `set -euo pipefail`, for at most
// BlockTimeout; a block fails with its file and line and its output. It
// takes minutes, so -short skips it; `make test` runs it (without -short).
func TestDocsShellBlocks(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the docs' shell blocks, which takes minutes; make test runs it")
	}
	root := repoRoot(t)
	blocks := docBlocks(t, root)
	r := &doccheck.Runner{Repo: root, Work: t.TempDir(), Timeout: blockTimeout(t)}

	// The binary is built once, in the directory blocks run in, so that a
	// block's own `go build` or `go run` finds the build cache warm.
	require.NoError(t, r.Fresh())
	bin := filepath.Join(r.Work, "stubborn")
	start := time.Now()
	build := exec.Command("go", "build", "-o", bin, "./cmd/stubborn")
	build.Dir = r.Dir()
	out, err := build.CombinedOutput()
	require.NoError(t, err, "go build ./cmd/stubborn: %s", out)
	t.Logf("built stubborn in %v", time.Since(start).Round(time.Second))
	r.Binaries = map[string]string{"stubborn": bin}

	start = time.Now()
	for _, err := range r.RunBlocks(t.Context(), blocks, t.Logf) {
		t.Error(err)
	}
	t.Logf("ran the blocks in %v", time.Since(start).Round(time.Second))
}

// TestConfigReference: docs/configuration.md documents every key the
// config parser takes, and only those.
func TestConfigReference(t *testing.T) {
	root := repoRoot(t)
	const ref = "docs/configuration.md"
	src, err := os.ReadFile(filepath.Join(root, ref))
	require.NoError(t, err, "the configuration reference")
	keys, err := doccheck.ParserKeys()
	require.NoError(t, err)
	documented := doccheck.DocumentedKeys(src)
	require.NotEmpty(t, documented, "%s documents no key: a key is a table row's first cell, in backticks", ref)
	for _, err := range doccheck.CompareKeys(ref, keys, documented) {
		t.Error(err)
	}
}
