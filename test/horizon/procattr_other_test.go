//go:build !linux

package horizon

import "syscall"

// childAttr: elsewhere the cleanup alone stops the subprocess.
func childAttr() *syscall.SysProcAttr { return nil }
