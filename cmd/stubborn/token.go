package main

import (
	"bufio"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/stubbornhq/stubborn/internal/delegates"
)

// cmdToken prints a new bearer token (32 random bytes, base64url) and the
// SHA-256 digest that a tenant's token_sha256 lists; with -hash, the digest
// of each token read from stdin, one a line.
func cmdToken(args []string, stdin io.Reader, stdout io.Writer) (int, error) {
	fs := newFlagSet("token")
	hash := fs.Bool("hash", false, "print the SHA-256 of each token read from stdin (one a line) instead of making one")
	if err := parseFlags(fs, args); err != nil {
		return 2, err
	}
	if *hash {
		sc := bufio.NewScanner(stdin)
		n := 0
		for sc.Scan() {
			if tok := strings.TrimSpace(sc.Text()); tok != "" {
				fmt.Fprintln(stdout, delegates.HashToken(tok))
				n++
			}
		}
		if err := sc.Err(); err != nil {
			return 1, err
		}
		if n == 0 {
			return 2, errors.New("token -hash: no token on stdin")
		}
		return 0, nil
	}
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	tok := base64.RawURLEncoding.EncodeToString(b)
	fmt.Fprintf(stdout, "token:        %s\ntoken_sha256: %s\n", tok, delegates.HashToken(tok))
	return 0, nil
}
