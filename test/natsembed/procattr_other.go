//go:build !linux

package natsembed

import "syscall"

// childAttr: elsewhere the cleanup alone stops the subprocess.
func childAttr() *syscall.SysProcAttr { return nil }
