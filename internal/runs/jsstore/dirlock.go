package jsstore

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
)

// lockFileName is the file in a data directory that its owner holds an
// exclusive lock on while its embedded server runs.
const lockFileName = "stubborn.lock"

// DirInUseError is StartEmbedded's error when another process (or another
// StartEmbedded in this one) holds the data directory: two embedded
// servers on the same files corrupt them, so the second refuses to start
// and touches nothing in it.
type DirInUseError struct {
	// Dir is the data directory.
	Dir string
	// PID is the holder's process id as it wrote it in the lock file; 0
	// when it could not be read.
	PID int
}

func (e *DirInUseError) Error() string {
	holder := "another process"
	if e.PID > 0 {
		holder = "process " + strconv.Itoa(e.PID)
	}
	return fmt.Sprintf("data directory %s is in use by %s: one server owns a data directory", e.Dir, holder)
}

// dirLock is an exclusive lock on a data directory. The operating system
// drops it when its holder dies, however it dies, so a killed server's
// successor opens the directory at once.
type dirLock struct{ f *os.File }

// lockDir takes the lock of dir, creating dir if need be, or fails at once
// with a *DirInUseError when another holds it. The holder writes its pid in
// the lock file for the next one's error.
func lockDir(dir string) (*dirLock, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("data directory: %w", err)
	}
	path := filepath.Join(dir, lockFileName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("data directory: %w", err)
	}
	if err := lockFile(f); err != nil {
		_ = f.Close()
		if errors.Is(err, errLocked) {
			return nil, &DirInUseError{Dir: dir, PID: readPID(path)}
		}
		return nil, fmt.Errorf("data directory %s: locking %s: %w", dir, lockFileName, err)
	}
	// The pid is a courtesy for the next one's error: a failure to write it
	// costs nothing but that.
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &dirLock{f: f}, nil
}

// release drops the lock. The file stays: removing it would let a third
// process lock a new file while a second still waits on the old one.
func (l *dirLock) release() {
	if l != nil {
		_ = l.f.Close() // closing the descriptor drops its lock
	}
}

// errLocked is lockFile's error when another holds the lock.
var errLocked = errors.New("locked by another")

// readPID reads the pid a holder wrote in the lock file at path; 0 if none.
func readPID(path string) int {
	b, err := os.ReadFile(path) // #nosec G304 -- the data directory's own lock file
	if err != nil || len(b) > 32 {
		return 0
	}
	pid, err := strconv.Atoi(string(bytes.TrimSpace(b)))
	if err != nil || pid <= 0 {
		return 0
	}
	return pid
}
