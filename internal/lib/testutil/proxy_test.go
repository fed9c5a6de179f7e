package testutil

import (
	"bufio"
	"errors"
	"io"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"
)

// lineServer greets each connection with "hello\n" at once, then answers each
// line it reads with the same line. Its side of each connection is sent on
// conns.
func lineServer(t *testing.T) (addr string, conns <-chan net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	ch := make(chan net.Conn, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			ch <- c
			go func() {
				defer c.Close()
				if _, err := io.WriteString(c, "hello\n"); err != nil {
					return
				}
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := io.WriteString(c, line); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String(), ch
}

// dialLines connects to addr and reads lines from it.
func dialLines(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	return c, bufio.NewReader(c)
}

func readLine(t *testing.T, r *bufio.Reader, want string) {
	t.Helper()
	got, err := r.ReadString('\n')
	if err != nil || got != want+"\n" {
		t.Fatalf("read %q, %v; want %q", got, err, want)
	}
}

func write(t *testing.T, c net.Conn, s string) {
	t.Helper()
	if _, err := io.WriteString(c, s); err != nil {
		t.Fatal(err)
	}
}

// What the client sends reaches the target the delay later; what the target
// sends is not held; a new delay holds what is read after it.
func TestProxyHoldsWhatTheClientSends(t *testing.T) {
	const delay = 500 * time.Millisecond
	target, _ := lineServer(t)
	p := StartProxy(t, target, delay)
	c, r := dialLines(t, p.Addr())

	start := time.Now()
	readLine(t, r, "hello")
	if took := time.Since(start); took >= delay {
		t.Fatalf("the target's greeting took %s: what the target sends is held too", took)
	}

	start = time.Now()
	write(t, c, "ping\n")
	readLine(t, r, "ping")
	if took := time.Since(start); took < delay {
		t.Fatalf("the echo came back after %s, before the %s delay", took, delay)
	}

	p.SetDelay(0)
	start = time.Now()
	write(t, c, "again\n")
	readLine(t, r, "again")
	if took := time.Since(start); took >= delay {
		t.Fatalf("with no delay the echo took %s", took)
	}
}

// Chunks are held side by side: three sent 50 ms apart arrive about the delay
// after each was sent, not one delay after another.
func TestProxyHoldsChunksSideBySide(t *testing.T) {
	const delay = 400 * time.Millisecond
	target, _ := lineServer(t)
	p := StartProxy(t, target, delay)
	c, r := dialLines(t, p.Addr())
	readLine(t, r, "hello")

	start := time.Now()
	for i, s := range []string{"one\n", "two\n", "three\n"} {
		if i > 0 {
			time.Sleep(50 * time.Millisecond) // apart, so the proxy reads three chunks
		}
		write(t, c, s)
	}
	readLine(t, r, "one")
	readLine(t, r, "two")
	readLine(t, r, "three")
	if took := time.Since(start); took < delay || took >= 2*delay {
		t.Fatalf("the three echoes took %s; want the %s delay once, plus the 100 ms between the sends", took, delay)
	}
}

// proxyGoroutines lists the goroutines running the proxy's code.
func proxyGoroutines() []string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		if strings.Contains(g, "testutil.(*Proxy)") {
			out = append(out, g)
		}
	}
	return out
}

// cleanupTB records the cleanups registered with it, for a test to run them
// itself, bounded.
type cleanupTB struct {
	testing.TB
	cleanups []func()
}

func (c *cleanupTB) Cleanup(f func()) { c.cleanups = append(c.cleanups, f) }

// When the test that started it ends, the proxy closes the listener and both
// sides of every connection, busy or idle, drops what it still holds without
// waiting for it, and leaves no goroutine behind.
func TestProxyClosesEverythingWhenTheTestEnds(t *testing.T) {
	if g := proxyGoroutines(); len(g) != 0 {
		t.Fatalf("proxy goroutines before the test:\n%s", strings.Join(g, "\n\n"))
	}
	target, serverSides := lineServer(t)
	tb := &cleanupTB{TB: t}
	p := StartProxy(tb, target, 0)
	if len(tb.cleanups) != 1 {
		t.Fatalf("StartProxy registered %d cleanups, want 1", len(tb.cleanups))
	}
	// Two connections: one idle, one with something held for 20 s.
	var clients []*bufio.Reader
	var conns, servers []net.Conn
	for range 2 {
		c, r := dialLines(t, p.Addr())
		readLine(t, r, "hello")
		write(t, c, "ping\n")
		readLine(t, r, "ping")
		conns, clients, servers = append(conns, c), append(clients, r), append(servers, <-serverSides)
	}
	p.SetDelay(20 * time.Second)
	write(t, conns[1], "held\n")
	time.Sleep(50 * time.Millisecond) // read by the proxy
	if len(proxyGoroutines()) == 0 {
		t.Fatal("no proxy goroutine while connections are open: proxyGoroutines sees nothing")
	}

	cleaned := make(chan struct{})
	go func() {
		defer close(cleaned)
		for _, f := range tb.cleanups {
			f()
		}
	}()
	select {
	case <-cleaned:
	case <-time.After(10 * time.Second):
		t.Fatal("the cleanup has not returned after 10 s: it waits for what is held, or for a connection it did not close")
	}
	if g := proxyGoroutines(); len(g) != 0 {
		t.Fatalf("proxy goroutines left after the cleanup:\n%s", strings.Join(g, "\n\n"))
	}
	for i := range conns {
		if _, err := clients[i].ReadString('\n'); !errors.Is(err, io.EOF) && !isReset(err) {
			t.Fatalf("client %d after the cleanup: read %v, want the connection closed", i, err)
		}
		_ = servers[i].SetDeadline(time.Now().Add(30 * time.Second))
		if n, err := servers[i].Read(make([]byte, 64)); err == nil {
			t.Fatalf("the target's side of connection %d after the cleanup read %d bytes: want it closed, and nothing held delivered", i, n)
		}
	}
	if c, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		_ = c.Close()
		t.Fatal("the proxy still accepts connections after the cleanup")
	}
}

func isReset(err error) bool {
	return err != nil && strings.Contains(err.Error(), "connection reset")
}
