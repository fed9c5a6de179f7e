package testutil

import (
	"net"
	"strconv"
	"sync"
	"testing"
)

// given holds every port FreePorts returned in this process: a port is
// handed out once, so that two addresses asked for apart (a Server's and its
// callout's metrics listeners, say) never name the same port because the
// kernel gave a just-closed port out again.
var given struct {
	sync.Mutex
	ports map[int]bool
}

// FreePorts returns n distinct loopback TCP ports that were free a moment
// ago, for servers that must start later on ports their clients or peers
// already know. The n listeners are open together, and no port is returned
// twice in a process; another process may still take one before the server
// starts.
func FreePorts(t testing.TB, n int) []int {
	t.Helper()
	given.Lock()
	defer given.Unlock()
	if given.ports == nil {
		given.ports = map[int]bool{}
	}
	ports := make([]int, 0, n)
	lns := make([]net.Listener, 0, n)
	defer func() {
		for _, ln := range lns {
			_ = ln.Close()
		}
	}()
	for len(ports) < n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		// Held open until the end either way, so the next Listen gets
		// another port.
		lns = append(lns, ln)
		port := ln.Addr().(*net.TCPAddr).Port
		if given.ports[port] {
			continue
		}
		given.ports[port] = true
		ports = append(ports, port)
	}
	return ports
}

// FreePort returns a loopback TCP port that was free a moment ago (FreePorts).
func FreePort(t testing.TB) int {
	t.Helper()
	return FreePorts(t, 1)[0]
}

// FreeAddr returns a loopback address, 127.0.0.1:port, that was free a moment
// ago (FreePorts).
func FreeAddr(t testing.TB) string {
	t.Helper()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(FreePort(t)))
}
