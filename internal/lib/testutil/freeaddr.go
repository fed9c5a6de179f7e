package testutil

import (
	"net"
	"strconv"
	"testing"
)

// FreePorts returns n distinct loopback TCP ports that were free a moment
// ago, for servers that must start later on ports their clients or peers
// already know. The n listeners are open together, so no port is returned
// twice; another process may still take one before the server starts.
func FreePorts(t testing.TB, n int) []int {
	t.Helper()
	ports := make([]int, 0, n)
	lns := make([]net.Listener, 0, n)
	defer func() {
		for _, ln := range lns {
			_ = ln.Close()
		}
	}()
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
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
