//go:build unix

package jsstore

import (
	"errors"
	"os"
	"syscall"
)

// lockFile takes an exclusive flock(2) on f without waiting. A flock
// belongs to the open file description: it dies with the process, and a
// second description of the same file in the same process is refused too.
func lockFile(f *os.File) error {
	err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) // #nosec G115 -- a descriptor fits an int
	if errors.Is(err, syscall.EWOULDBLOCK) {
		return errLocked
	}
	return err
}
