// Command pause is the node test tier's sandbox program: the first process
// of every pod, holding its namespaces open until the kubelet stops it. As
// PID 1 of the pod's PID namespace (when shared) it reaps orphaned children,
// and it exits on SIGTERM or SIGINT so a pod is torn down at once.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
