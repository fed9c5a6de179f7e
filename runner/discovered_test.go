package runner

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/compass-runner/identity/internal/lib/natsurl"
	"github.com/compass-runner/identity/internal/lib/testlog"
	"github.com/compass-runner/identity/test/natsembed"
)

// discoveredToken is the token the links of these tests send; a trap that
// reads it has proved a leak.
const discoveredToken = "discovered-test-token"

// advertised is where the second node of these clusters says its clients
// connect: TEST-NET-1, never a loopback address. Every dial to it goes,
// through the test's dialer, to a local trap.
const advertised = "192.0.2.10:4222"

// trap is a listener posing as a nats-server: it sends an INFO without TLS
// and reports the first line each client sends back (its CONNECT, with the
// token), or "" when the client closed without one.
type trap struct {
	ln    net.Listener
	lines chan string
}

func newTrap(t *testing.T) *trap {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tr := &trap{ln: ln, lines: make(chan string, 16)}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				// A client that starts a TLS handshake instead of answering
				// sends no line: the deadline ends the wait well before the
				// tests' own.
				_ = c.SetDeadline(time.Now().Add(2 * time.Second))
				fmt.Fprint(c, `INFO {"server_id":"TRAP","version":"2.15.2","proto":1,"host":"192.0.2.10","port":4222,"max_payload":1048576}`+"\r\n")
				line, err := bufio.NewReader(c).ReadString('\n')
				if err != nil && !errors.Is(err, io.EOF) {
					line = ""
				}
				// Only a protocol line in clear text counts (TLS handshake
				// bytes may happen to hold a newline).
				if !strings.HasPrefix(line, "CONNECT ") && !strings.HasPrefix(line, "PING") {
					line = ""
				}
				select {
				case tr.lines <- line:
				default:
				}
			}()
		}
	}()
	return tr
}

// redirect is the dialer under the link's guard: it records every address
// it is asked for and sends the advertised one to the trap.
type redirect struct {
	trap string
	mu   sync.Mutex
	seen []string
}

func (r *redirect) Dial(network, addr string) (net.Conn, error) {
	r.mu.Lock()
	r.seen = append(r.seen, addr)
	r.mu.Unlock()
	if addr == advertised {
		addr = r.trap
	}
	return net.DialTimeout(network, addr, 5*time.Second)
}

func (r *redirect) dialed(addr string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, a := range r.seen {
		if a == addr {
			return true
		}
	}
	return false
}

// logWatch keeps a log and closes seen at the first line containing want.
type logWatch struct {
	testlog.Buffer
	want string
	seen chan struct{}
	once sync.Once
}

func (w *logWatch) Write(p []byte) (int, error) {
	n, err := w.Buffer.Write(p)
	if bytes.Contains(p, []byte(w.want)) {
		w.once.Do(func() { close(w.seen) })
	}
	return n, err
}

// discoveryCluster starts node A from confA (modA adjusting its options),
// runs a link to it (scheme://127.0.0.1:port) configured by cfg, and once the
// link is connected starts node B, routed to A and advertising advertised to
// clients; it returns A after the link learned B from A's INFO.
func discoveryCluster(t *testing.T, confA string, modA func(*server.Options), scheme string, cfg LinkConfig) *server.Server {
	t.Helper()
	a := natsembed.Serve(t, confA, modA)
	discovered := make(chan struct{}, 1)
	cfg.Options = append(cfg.Options, nats.DiscoveredServersHandler(func(nc *nats.Conn) {
		for _, s := range nc.DiscoveredServers() {
			if strings.HasSuffix(s, "://"+advertised) {
				select {
				case discovered <- struct{}{}:
				default:
				}
			}
		}
	}))
	evs := newEvents()
	cfg.URL = fmt.Sprintf("%s://127.0.0.1:%d", scheme, a.Addr().(*net.TCPAddr).Port)
	cfg.OnEvent = evs.add
	cfg.RunnerID, cfg.Tokens = "discovery-runner", StaticToken(discoveredToken)
	cfg.Handler = func(*nats.Msg) {}
	cfg.ReconnectWait, cfg.ReconnectJitter, cfg.MaxReconnectJitter = 50*time.Millisecond, 50*time.Millisecond, 200*time.Millisecond
	l, err := NewLink(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(DrainTimeout + 5*time.Second):
			t.Error("link did not stop")
		}
	})
	evs.wait(t, 10*time.Second, "the link's first connect", count(EventConnected, 1))

	natsembed.Serve(t, fmt.Sprintf(`
listen: "127.0.0.1:-1"
client_advertise: %q
cluster { name: discovery, listen: "127.0.0.1:-1", routes: [ "nats://127.0.0.1:%d" ] }
`, advertised, a.ClusterAddr().Port), nil)
	select {
	case <-discovered:
	case <-time.After(10 * time.Second):
		t.Fatal("the link never learned the second node from INFO")
	}
	return a
}

const clusterNodeA = `
listen: "127.0.0.1:-1"
cluster { name: discovery, listen: "127.0.0.1:-1" }
`

// A link configured with nats:// to loopback learns a non-loopback server
// from the cluster; when its own server goes, it does not send the token there
// in clear text: the guard refuses the dial and says why, and the dialer
// below it never sees the address. With AllowPlaintext the same reconnect
// delivers the token to that address, which is what the guard prevents.
func TestLinkRefusesPlaintextToDiscoveredServer(t *testing.T) {
	for _, allow := range []bool{false, true} {
		t.Run(fmt.Sprintf("allow=%v", allow), func(t *testing.T) {
			tr := newTrap(t)
			dialer := &redirect{trap: tr.ln.Addr().String()}
			logs := &logWatch{want: "runner: not connecting to a NATS server the cluster advertised", seen: make(chan struct{})}
			a := discoveryCluster(t, clusterNodeA, nil, "nats", LinkConfig{
				AllowPlaintext: allow, Logger: slog.New(slog.NewTextHandler(logs, nil)),
				Options: []nats.Option{nats.SetCustomDialer(dialer)},
			})
			a.Shutdown()
			if allow {
				select {
				case line := <-tr.lines:
					if !strings.HasPrefix(line, "CONNECT ") || !strings.Contains(line, `"auth_token":"`+discoveredToken+`"`) {
						t.Fatalf("the trap read no CONNECT with the token (%d bytes)", len(line))
					}
				case <-time.After(10 * time.Second):
					t.Fatalf("no reconnect reached the advertised server:\n%s", logs.String())
				}
				return
			}
			select {
			case <-logs.seen:
			case <-time.After(10 * time.Second):
				t.Fatalf("no refusal logged:\n%s", logs.String())
			}
			if dialer.dialed(advertised) {
				t.Fatal("the dialer under the guard was asked for the advertised address")
			}
			select {
			case <-tr.lines:
				t.Fatal("the trap was reached")
			default:
			}
			if !strings.Contains(logs.String(), "addr="+advertised) {
				t.Fatalf("the refusal does not name the address:\n%s", logs.String())
			}
			if strings.Contains(logs.String(), discoveredToken) {
				t.Fatal("the token reached the log")
			}
		})
	}
}

// tlsNode is node A of a TLS cluster: a nats-server whose client port has
// httptest's certificate, and the PEM file a client trusts it with.
func tlsNode(t *testing.T) (mod func(*server.Options), caFile string) {
	t.Helper()
	srv := httptest.NewTLSServer(http.NotFoundHandler())
	t.Cleanup(srv.Close)
	caFile = filepath.Join(t.TempDir(), "nats-ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	certs := srv.TLS.Certificates
	return func(o *server.Options) {
		o.TLSConfig = &tls.Config{Certificates: certs, MinVersion: tls.VersionTLS12}
		o.TLSTimeout = 2
	}, caFile
}

// With tls:// configured, nats.go dials a server learned from INFO as
// tls:// too: a server that offers no TLS gets no CONNECT (nats.go ends the
// connection with ErrSecureConnWanted), so no guard is needed and none is
// installed.
func TestLinkKeepsTLSToDiscoveredServer(t *testing.T) {
	mod, caFile := tlsNode(t)
	tr := newTrap(t)
	dialer := &redirect{trap: tr.ln.Addr().String()}
	logs := &testlog.Buffer{}
	cfg := LinkConfig{Logger: slog.New(slog.NewTextHandler(logs, nil)),
		Options: []nats.Option{nats.RootCAs(caFile), nats.SetCustomDialer(dialer)}}
	a := discoveryCluster(t, clusterNodeA, mod, "tls", cfg)
	a.Shutdown()
	select {
	case line := <-tr.lines:
		if line != "" {
			t.Fatalf("the client sent %d bytes in clear text to a server without TLS", len(line))
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("no reconnect reached the advertised server:\n%s", logs.String())
	}
	if !dialer.dialed(advertised) {
		t.Fatal("the advertised server was not dialed")
	}
	if strings.Contains(logs.String(), "runner: not connecting to a NATS server the cluster advertised") {
		t.Fatalf("the guard refused a TLS dial:\n%s", logs.String())
	}
}

// The guard is there exactly when some connection of the link could go
// without TLS to a host that is not loopback.
func TestPlaintextGuardOnlyWithoutTLS(t *testing.T) {
	_, caFile := tlsNode(t)
	for _, tc := range []struct {
		url   string
		opts  []nats.Option
		allow bool
		guard bool
	}{
		{url: "nats://127.0.0.1:4222", guard: true},
		{url: "localhost:4222", guard: true},
		{url: "ws://127.0.0.1:8080", guard: true},
		{url: "nats://127.0.0.1:4222", allow: true},
		{url: "tls://nats.example:4222"},
		{url: " TLS://a.example:4222, nats://127.0.0.1:4222"},
		{url: "wss://nats.example:443"},
		{url: "nats://127.0.0.1:4222", opts: []nats.Option{nats.RootCAs(caFile)}},
		{url: "nats://127.0.0.1:4222", opts: []nats.Option{nats.Secure()}},
		{url: "nats://127.0.0.1:4222", opts: []nats.Option{nats.TLSHandshakeFirst()}},
	} {
		l, err := NewLink(LinkConfig{URL: tc.url, RunnerID: "r", Tokens: StaticToken("t"), Handler: func(*nats.Msg) {},
			AllowPlaintext: tc.allow, Options: tc.opts})
		if err != nil {
			t.Fatal(err)
		}
		if got := l.guard != nil; got != tc.guard {
			t.Errorf("%s (allow %v, %d options): guard %v, want %v", tc.url, tc.allow, len(tc.opts), got, tc.guard)
		}
	}

	// Loopback passes to the dialer below; anything else is refused with
	// natsurl.ErrPlaintext, before that dialer sees it.
	below := &redirect{trap: "127.0.0.1:1"}
	logs := &testlog.Buffer{}
	l, err := NewLink(LinkConfig{URL: "nats://127.0.0.1:4222", RunnerID: "r", Tokens: StaticToken("t"), Handler: func(*nats.Msg) {},
		Options: []nats.Option{nats.SetCustomDialer(below)}, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	for _, addr := range []string{"127.0.0.1:1", "[::1]:1", "localhost:1"} {
		if c, err := l.guard.Dial("tcp", addr); err == nil {
			c.Close()
		}
		if !below.dialed(addr) {
			t.Errorf("loopback %s did not reach the dialer below", addr)
		}
	}
	for _, addr := range []string{"10.0.0.5:4222", "nats.example:4222", "[2001:db8::1]:4222"} {
		_, err := l.guard.Dial("tcp", addr)
		want := "runner: not dialing " + addr + ": " + natsurl.ErrPlaintext.Error()
		if err == nil || err.Error() != want || !errors.Is(err, natsurl.ErrPlaintext) {
			t.Errorf("Dial %s = %v, want %s", addr, err, want)
		}
		if below.dialed(addr) {
			t.Errorf("%s reached the dialer below", addr)
		}
	}
	// Logged once per address within authLogEvery, however often refused.
	if _, err := l.guard.Dial("tcp", "10.0.0.5:4222"); err == nil {
		t.Fatal("second dial passed")
	}
	if got := strings.Count(logs.String(), "addr=10.0.0.5:4222"); got != 1 {
		t.Fatalf("refusal of 10.0.0.5 logged %d times, want 1:\n%s", got, logs.String())
	}
}
