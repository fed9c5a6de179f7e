//go:build unix

package devstack

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// tryLock takes f's flock without waiting: exclusive for the holder, shared
// for a probe (which conflicts only with a holder). errDataDirInUse when
// another open file description holds a conflicting lock.
func tryLock(f *os.File, exclusive bool) error {
	how := syscall.LOCK_SH
	if exclusive {
		how = syscall.LOCK_EX
	}
	err := syscall.Flock(int(f.Fd()), how|syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		return errDataDirInUse
	}
	if err != nil {
		return fmt.Errorf("flock: %w", err)
	}
	return nil
}

func unlock(f *os.File) error { return syscall.Flock(int(f.Fd()), syscall.LOCK_UN) }
