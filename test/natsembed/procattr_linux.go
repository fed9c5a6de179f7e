package natsembed

import "syscall"

// childAttr kills a nats-server subprocess with the test binary, so a test
// that panics or times out (and skips its cleanups) leaves no server behind.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
