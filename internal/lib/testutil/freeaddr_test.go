package testutil

import (
	"net"
	"strconv"
	"testing"
)

// FreePorts returns distinct loopback ports a server can then listen on;
// FreePort and FreeAddr return one.
func TestFreePortsAreDistinctAndListenable(t *testing.T) {
	ports := FreePorts(t, 8)
	if len(ports) != 8 {
		t.Fatalf("%d ports, want 8", len(ports))
	}
	seen := map[int]bool{}
	for _, p := range ports {
		if p <= 0 || p > 65535 || seen[p] {
			t.Fatalf("ports %v: want 8 distinct valid ports", ports)
		}
		seen[p] = true
	}
	addrs := []string{FreeAddr(t), net.JoinHostPort("127.0.0.1", strconv.Itoa(FreePort(t))), net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0]))}
	for _, addr := range addrs {
		host, _, err := net.SplitHostPort(addr)
		if err != nil || host != "127.0.0.1" {
			t.Fatalf("address %q is not on 127.0.0.1: %v", addr, err)
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("listen on %s: %v", addr, err)
		}
		_ = ln.Close()
	}
}

// Ports asked for one at a time, each listener closed in between, are still
// distinct: the kernel may hand a just-closed port out again, and two
// daemons of one test given the same port would collide at their start.
func TestFreePortNeverRepeatsInAProcess(t *testing.T) {
	seen := map[int]bool{}
	for range 300 {
		p := FreePort(t)
		if seen[p] {
			t.Fatalf("FreePort returned %d twice", p)
		}
		seen[p] = true
	}
}
