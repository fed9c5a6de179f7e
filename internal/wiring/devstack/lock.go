package devstack

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// LockFile is the file in the data dir a running dev holds locked. Its
// content is the holder's process ID, for the message a second dev gives.
const LockFile = "dev.lock"

// errDataDirInUse is a data dir whose lock another process holds.
var errDataDirInUse = errors.New("in use")

// dataDirLock is a running dev's hold on its data dir. Two devs in one data
// dir would each write their own CA, tokens and dev issuer CA over the
// other's (so the first one's Runner and CLI would no longer trust its
// door): the lock keeps the second one out, whatever its ports. It is an
// advisory lock (flock on Unix) the kernel drops when the process ends, so a
// dev that was killed leaves no stale lock behind; the file itself stays.
type dataDirLock struct {
	f *os.File
}

// probeDataDirLock reports, without creating or writing anything, whether
// another process holds dir's lock, and that process's ID when it wrote
// one (0 when unknown). A missing dir or lock file is not held.
func probeDataDirLock(dir string) (held bool, pid int, err error) {
	f, err := os.Open(filepath.Join(dir, LockFile))
	if errors.Is(err, os.ErrNotExist) {
		return false, 0, nil
	}
	if err != nil {
		return false, 0, fmt.Errorf("server: dev: data dir lock: %w", err)
	}
	defer f.Close()
	switch err := tryLock(f, false); {
	case errors.Is(err, errDataDirInUse):
		return true, readPID(f), nil
	case err != nil:
		return false, 0, fmt.Errorf("server: dev: data dir lock: %w", err)
	}
	// Held by nobody: let go of the probe's shared lock at once.
	_ = unlock(f)
	return false, 0, nil
}

// lockDataDir takes dir's lock for this process, creating the file when it
// is missing, and writes the process ID into it. errDataDirInUse: another
// process holds it (it won the race after the probe).
func lockDataDir(dir string) (*dataDirLock, error) {
	f, err := os.OpenFile(filepath.Join(dir, LockFile), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("server: dev: data dir lock: %w", err)
	}
	if err := tryLock(f, true); err != nil {
		f.Close()
		return nil, err
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &dataDirLock{f: f}, nil
}

// Release lets go of the lock (closing the file does too).
func (l *dataDirLock) Release() {
	_ = unlock(l.f)
	_ = l.f.Close()
}

// readPID reads the holder's process ID from the lock file (0: unknown).
func readPID(f *os.File) int {
	b := make([]byte, 32)
	n, _ := f.ReadAt(b, 0)
	pid, err := strconv.Atoi(strings.TrimSpace(string(b[:n])))
	if err != nil || pid <= 0 {
		return 0
	}
	return pid
}
