package testutil

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Proxy forwards TCP connections from a loopback address to a target and
// holds every chunk a client sends for the delay set when the proxy read it
// before passing it on, in order; what the target sends back is not held.
// Chunks are held side by side, not one after another, so a connection is
// behind by the delay, not by the delay times its chunks. It stands for a
// slow network or a server that reads one connection's messages late.
//
// Close ends the listener and every connection and waits for all the
// proxy's goroutines; StartProxy arranges it for the end of the test.
type Proxy struct {
	target string
	ln     net.Listener
	delay  atomic.Int64 // a time.Duration
	done   chan struct{}
	once   sync.Once
	wg     sync.WaitGroup

	mu     sync.Mutex
	closed bool
	conns  map[net.Conn]struct{} // both sides of every open connection
}

// StartProxy listens on a loopback port and forwards to target (host:port),
// holding what clients send for delay (0: none, until SetDelay). It is
// closed when the test ends (t.Cleanup, registered here, on the caller's
// goroutine), after which none of its goroutines is left.
func StartProxy(t testing.TB, target string, delay time.Duration) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{target: target, ln: ln, done: make(chan struct{}), conns: map[net.Conn]struct{}{}}
	p.delay.Store(int64(delay))
	t.Cleanup(p.Close)
	p.wg.Go(p.accept)
	return p
}

// Addr is the proxy's address, 127.0.0.1:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// SetDelay sets how long the chunks read from now on are held.
func (p *Proxy) SetDelay(d time.Duration) { p.delay.Store(int64(d)) }

// Close stops accepting, closes both sides of every connection, drops what
// is still held, and returns once all the proxy's goroutines have ended. It
// may be called more than once.
func (p *Proxy) Close() {
	p.once.Do(func() {
		close(p.done)
		_ = p.ln.Close()
		p.mu.Lock()
		p.closed = true
		for c := range p.conns {
			_ = c.Close()
		}
		p.mu.Unlock()
	})
	p.wg.Wait()
}

func (p *Proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			_ = c.Close()
			_ = s.Close()
			return
		}
		p.conns[c], p.conns[s] = struct{}{}, struct{}{}
		p.mu.Unlock()
		p.wg.Go(func() { p.forward(c, s) })
	}
}

// chunk is what a client sent, and when it may go on.
type chunk struct {
	b  []byte
	at time.Time
}

// forward runs one connection: c is the client's side, s the target's.
// Whichever side ends, the other is closed, and forward returns once its
// three goroutines have.
func (p *Proxy) forward(c, s net.Conn) {
	defer func() {
		p.mu.Lock()
		delete(p.conns, c)
		delete(p.conns, s)
		p.mu.Unlock()
	}()
	var wg sync.WaitGroup
	defer wg.Wait()
	held := make(chan chunk, 1024)
	written := make(chan struct{}) // closed when the writer stops
	// The target's bytes go straight back.
	wg.Go(func() {
		_, _ = io.Copy(c, s)
		_ = c.Close()
	})
	// The client's bytes are read as they come and stamped with their time.
	wg.Go(func() {
		defer close(held)
		for {
			b := make([]byte, 32<<10)
			n, err := c.Read(b)
			if n > 0 {
				select {
				case held <- chunk{b[:n], time.Now().Add(time.Duration(p.delay.Load()))}:
				case <-written:
					return
				case <-p.done:
					return
				}
			}
			if err != nil {
				return
			}
		}
	})
	// And go on to the target when their time comes.
	wg.Go(func() {
		defer close(written)
		defer s.Close()
		for ch := range held {
			// The delay is what the proxy is for: it emulates time the bytes
			// spend queued, so it waits on the clock.
			if d := time.Until(ch.at); d > 0 {
				timer := time.NewTimer(d)
				select {
				case <-timer.C:
				case <-p.done:
					timer.Stop()
					return
				}
			}
			if _, err := s.Write(ch.b); err != nil {
				return
			}
		}
	})
}
