package door_test

// Tests that pin what mutation testing (.ci/mutation) found no test for:
// NewServer's limits, ServeTLS's shutdown and errors, NewHandler's required
// parts, the services' own subject-kind check, and the enrollment string
// bounds at exactly MaxClientStringLen.

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/compass-runner/identity/door"
	adminv1 "github.com/compass-runner/identity/gen/compass/admin/v1"
	runnerv1 "github.com/compass-runner/identity/gen/compass/runner/v1"
	"github.com/compass-runner/identity/internal/lib/testlog"
	"github.com/compass-runner/identity/internal/lib/testutil"
	"github.com/compass-runner/identity/verifier"
)

// tlsMaterial returns a server TLS config carrying httptest's certificate
// (valid for 127.0.0.1) and an HTTP/2-capable client that trusts it.
func tlsMaterial(t *testing.T) (*tls.Config, *http.Client) {
	t.Helper()
	ts := testutil.ServeTLS(t, http.NotFoundHandler())
	return &tls.Config{Certificates: ts.TLS.Certificates}, ts.Client()
}

// listen returns a loopback listener that the test closes at its end.
func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	return ln
}

// NewServer raises a TLS minimum below 1.2 to 1.2, keeps a higher one, and
// leaves the caller's config alone.
func TestNewServerTLSMinimum(t *testing.T) {
	for _, tc := range []struct {
		name    string
		min     uint16
		want    uint16
		wantStr string
	}{
		{"unset", 0, tls.VersionTLS12, "TLS 1.2"},
		{"TLS 1.0 raised", tls.VersionTLS10, tls.VersionTLS12, "TLS 1.2"},
		{"TLS 1.1 raised", tls.VersionTLS11, tls.VersionTLS12, "TLS 1.2"},
		{"TLS 1.2 kept", tls.VersionTLS12, tls.VersionTLS12, "TLS 1.2"},
		{"TLS 1.3 kept", tls.VersionTLS13, tls.VersionTLS13, "TLS 1.3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := &tls.Config{MinVersion: tc.min}
			srv := door.NewServer(http.NotFoundHandler(), in, nil)
			if got := srv.TLSConfig.MinVersion; got != tc.want {
				t.Errorf("MinVersion = %s, want %s", tls.VersionName(got), tc.wantStr)
			}
			if in.MinVersion != tc.min {
				t.Errorf("NewServer changed the caller's config: MinVersion %s", tls.VersionName(in.MinVersion))
			}
		})
	}
}

// Every limit NewServer sets is a real one: net/http reads a zero timeout or
// header size as "none" (or its own default).
func TestNewServerLimitsAreSet(t *testing.T) {
	srv := door.NewServer(http.NotFoundHandler(), &tls.Config{}, nil)
	for _, l := range []struct {
		name      string
		got, want time.Duration
	}{
		{"ReadHeaderTimeout", srv.ReadHeaderTimeout, door.ReadHeaderTimeout},
		{"IdleTimeout", srv.IdleTimeout, door.IdleTimeout},
	} {
		if l.got != l.want || l.got <= 0 {
			t.Errorf("%s = %v, want door.%s (%v), above zero", l.name, l.got, l.name, l.want)
		}
	}
	if srv.MaxHeaderBytes != door.MaxHeaderBytes || srv.MaxHeaderBytes < verifier.MaxTokenBytes {
		t.Errorf("MaxHeaderBytes = %d, want door.MaxHeaderBytes (%d), room for a %d-byte token",
			srv.MaxHeaderBytes, door.MaxHeaderBytes, verifier.MaxTokenBytes)
	}
}

// The http.Server's own errors (here a client that speaks neither TLS nor HTTP) go to
// the logger NewServer was given, as warnings.
func TestNewServerLogsServerErrors(t *testing.T) {
	cfg, _ := tlsMaterial(t)
	logs := &testlog.Buffer{}
	srv := door.NewServer(http.NotFoundHandler(), cfg, slog.New(slog.NewTextHandler(logs, nil)))
	ln := listen(t)
	ctx, cancel := context.WithCancel(t.Context())
	served := make(chan error, 1)
	go func() { served <- door.ServeTLS(ctx, srv, ln) }()
	defer func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("ServeTLS after cancel: %v", err)
		}
	}()

	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	// Not a TLS record, nor HTTP (which the server answers with a 400 and does
	// not log).
	if _, err := io.WriteString(c, "hello, this is not TLS\r\n"); err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, c) // the server hangs up on the handshake
	_ = c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(logs.String(), "TLS handshake error") {
		if time.Now().After(deadline) {
			t.Fatalf("no TLS handshake error logged; logs:\n%s", logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !strings.Contains(logs.String(), "level=WARN") {
		t.Errorf("the server error is not a warning:\n%s", logs.String())
	}
}

// When ctx ends, ServeTLS stops taking connections, lets a call in flight
// finish, and returns nil.
func TestServeTLSWaitsForCallsInFlight(t *testing.T) {
	cfg, client := tlsMaterial(t)
	started, release := make(chan struct{}), make(chan struct{})
	srv := door.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-release
		_, _ = io.WriteString(w, "finished "+r.Proto)
	}), cfg, nil)
	ln := listen(t)
	addr := ln.Addr().String()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- door.ServeTLS(ctx, srv, ln) }()

	type result struct {
		body string
		err  error
	}
	call := make(chan result, 1)
	go func() {
		res, err := client.Get("https://" + addr + "/slow")
		if err != nil {
			call <- result{err: err}
			return
		}
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		call <- result{string(b), err}
	}()
	select {
	case <-started:
	case r := <-call:
		t.Fatalf("the call ended before its handler ran: %v", r.err)
	}
	cancel()
	// Shutdown closes the listener first: once a new connection is refused,
	// the door is shutting down with the call still in its handler.
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			break
		}
		_ = c.Close()
		if time.Now().After(deadline) {
			t.Fatal("the door still accepts connections after ctx ended")
		}
		time.Sleep(5 * time.Millisecond)
	}
	select {
	case err := <-served:
		t.Fatalf("ServeTLS returned (%v) while a call was in flight", err)
	default:
	}
	close(release)
	if r := <-call; r.err != nil || r.body != "finished HTTP/2.0" {
		t.Fatalf("the call in flight: body %q, error %v; want it finished over HTTP/2", r.body, r.err)
	}
	if err := <-served; err != nil {
		t.Fatalf("ServeTLS after a graceful shutdown = %v, want nil", err)
	}
}

// A server that cannot serve (no certificate) makes ServeTLS return that
// error, also when ctx has already ended: a start-up failure is never
// reported as a clean shutdown.
func TestServeTLSReturnsTheServeError(t *testing.T) {
	check := func(t *testing.T, err error) {
		t.Helper()
		if err == nil || !strings.HasPrefix(err.Error(), "door: serve: ") || !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("ServeTLS without a certificate = %v, want door: serve: (the missing key pair)", err)
		}
	}
	t.Run("ctx live", func(t *testing.T) {
		srv := door.NewServer(http.NotFoundHandler(), &tls.Config{}, nil)
		check(t, door.ServeTLS(t.Context(), srv, listen(t)))
	})
	t.Run("ctx already ended", func(t *testing.T) {
		// ServeTLS's goroutine fails at once; the shutdown path sees the
		// error unless its goroutine wins the select first, so try often.
		for range 25 {
			ctx, cancel := context.WithCancel(t.Context())
			cancel()
			srv := door.NewServer(http.NotFoundHandler(), &tls.Config{}, nil)
			check(t, door.ServeTLS(ctx, srv, listen(t)))
		}
	})
}

// NewHandler refuses a config missing any one of its three required parts.
func TestNewHandlerRequiresResolverEnrollerAndRunners(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	full := door.Config{Resolver: h.resolver, Enroller: h.st, Runners: h.st}
	for name, cfg := range map[string]func(c *door.Config){
		"no resolver": func(c *door.Config) { c.Resolver = nil },
		"no enroller": func(c *door.Config) { c.Enroller = nil },
		"no runners":  func(c *door.Config) { c.Runners = nil },
	} {
		t.Run(name, func(t *testing.T) {
			c := full
			cfg(&c)
			c.Metrics = prometheus.NewRegistry()
			handler, err := door.NewHandler(c)
			if err == nil || err.Error() != "door: Resolver, Enroller and Runners are required" || handler != nil {
				t.Fatalf("NewHandler = %v, %v; want the required-parts error", handler, err)
			}
		})
	}
	full.Metrics = prometheus.NewRegistry()
	if _, err := door.NewHandler(full); err != nil {
		t.Fatalf("NewHandler with all three: %v", err)
	}
}

// The services check the subject's kind themselves, so one served without
// the interceptor (or behind the other service's) never runs for the wrong
// kind of caller.
func TestServicesRefuseTheOtherKindOfSubject(t *testing.T) {
	ctx := t.Context()
	account := door.WithSubject(ctx, verifier.Subject{Kind: verifier.SubjectAccount, ID: "ops"})
	runner := door.WithSubject(ctx, verifier.Subject{Kind: verifier.SubjectRunner, ID: "r1"})
	var rs door.RunnerService
	var as door.AdminService
	for name, call := range map[string]func() error{
		"Enroll, no subject": func() error { _, err := rs.Enroll(ctx, connect.NewRequest(&runnerv1.EnrollRequest{})); return err },
		"Enroll, account":    func() error { _, err := rs.Enroll(account, connect.NewRequest(&runnerv1.EnrollRequest{})); return err },
		"ListRunners, no subject": func() error {
			_, err := as.ListRunners(ctx, connect.NewRequest(&adminv1.ListRunnersRequest{}))
			return err
		},
		"ListRunners, runner": func() error {
			_, err := as.ListRunners(runner, connect.NewRequest(&adminv1.ListRunnersRequest{}))
			return err
		},
		"PingRunner, runner": func() error {
			_, err := as.PingRunner(runner, connect.NewRequest(&adminv1.PingRunnerRequest{RunnerId: "r1"}))
			return err
		},
		"PingRunner, unknown subject": func() error {
			_, err := as.PingRunner(ctx, connect.NewRequest(&adminv1.PingRunnerRequest{RunnerId: "r1"}))
			return err
		},
	} {
		t.Run(name, func(t *testing.T) {
			wantCode(t, call(), connect.CodeUnauthenticated, "unauthenticated")
		})
	}
}

// runner_id, version and hostname may be exactly MaxClientStringLen bytes.
func TestEnrollStringsAtTheLimit(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	tok := h.mint(t, verifier.SubjectRunner, "r1")
	limit := door.MaxClientStringLen
	enroll := func(m *runnerv1.EnrollRequest) error {
		_, err := h.runnerClient().Enroll(t.Context(), bearer(m, tok))
		return err
	}
	// A runner_id at the limit is compared with the token's Runner ID (and
	// differs); one byte more is refused for its length.
	wantCode(t, enroll(&runnerv1.EnrollRequest{RunnerId: strings.Repeat("r", limit)}), connect.CodePermissionDenied, "")
	wantCode(t, enroll(&runnerv1.EnrollRequest{RunnerId: strings.Repeat("r", limit+1)}), connect.CodeInvalidArgument, "")
	version, hostname := strings.Repeat("v", limit), strings.Repeat("h", limit)
	for _, m := range []*runnerv1.EnrollRequest{{Version: version}, {Hostname: hostname}, {Version: version, Hostname: hostname}} {
		if err := enroll(m); err != nil {
			t.Fatalf("Enroll(version %d bytes, hostname %d bytes): %v", len(m.GetVersion()), len(m.GetHostname()), err)
		}
	}
	r, err := h.st.GetRunner(t.Context(), "r1")
	if err != nil {
		t.Fatal(err)
	}
	if r.Version != version || r.Hostname != hostname {
		t.Fatalf("stored version %d bytes, hostname %d bytes; want both %d", len(r.Version), len(r.Hostname), limit)
	}
	for _, m := range []*runnerv1.EnrollRequest{{Version: version + "v"}, {Hostname: hostname + "h"}} {
		wantCode(t, enroll(m), connect.CodeInvalidArgument, "")
	}
}
