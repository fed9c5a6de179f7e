package runner

import (
	"context"
	"encoding/pem"
	"errors"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

const (
	echoUnary  = "/test.v1.EchoService/Echo"
	echoStream = "/test.v1.EchoService/EchoStream"
)

// doorRecorder is a real connect-go server (gRPC over HTTP/2 + TLS in
// httptest) whose interceptor records the authorization header of every call.
type doorRecorder struct {
	mu      sync.Mutex
	headers []string
	fail    []connect.Code // answers for the next calls, then success
	block   bool           // block until the call's context ends
	srv     *httptest.Server
}

func (d *doorRecorder) record(h http.Header) (connect.Code, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.headers = append(d.headers, h.Get("Authorization"))
	if len(d.fail) > 0 {
		c := d.fail[0]
		d.fail = d.fail[1:]
		return c, true
	}
	return 0, false
}

func (d *doorRecorder) seen() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.headers...)
}

func newDoor(t *testing.T) *doorRecorder {
	t.Helper()
	d := &doorRecorder{}
	rec := connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			if code, fail := d.record(req.Header()); fail {
				return nil, connect.NewError(code, errors.New("injected"))
			}
			if d.block {
				<-ctx.Done()
				return nil, connect.NewError(connect.CodeDeadlineExceeded, ctx.Err())
			}
			return next(ctx, req)
		}
	})
	mux := http.NewServeMux()
	mux.Handle(echoUnary, connect.NewUnaryHandler(echoUnary,
		func(_ context.Context, req *connect.Request[wrapperspb.StringValue]) (*connect.Response[wrapperspb.StringValue], error) {
			return connect.NewResponse(req.Msg), nil
		}, connect.WithInterceptors(rec)))
	mux.Handle(echoStream, connect.NewServerStreamHandler(echoStream,
		func(_ context.Context, req *connect.Request[wrapperspb.StringValue], s *connect.ServerStream[wrapperspb.StringValue]) error {
			d.record(req.Header())
			return s.Send(req.Msg)
		}))
	d.srv = httptest.NewUnstartedServer(mux)
	d.srv.EnableHTTP2 = true
	d.srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the untrusted-CA case logs a handshake error
	d.srv.StartTLS()
	t.Cleanup(d.srv.Close)
	return d
}

func (d *doorRecorder) unaryClient(src TokenSource) *connect.Client[wrapperspb.StringValue, wrapperspb.StringValue] {
	return connect.NewClient[wrapperspb.StringValue, wrapperspb.StringValue](d.srv.Client(), d.srv.URL+echoUnary,
		connect.WithGRPC(), connect.WithInterceptors(NewBearerInterceptor(src, slog.New(slog.DiscardHandler))))
}

// echoCall is one Echo call through client, as Retry.Do makes it.
func echoCall(client *connect.Client[wrapperspb.StringValue, wrapperspb.StringValue]) func(context.Context) error {
	return func(ctx context.Context) error {
		_, err := client.CallUnary(ctx, connect.NewRequest(wrapperspb.String("x")))
		return err
	}
}

// elapsed is a Retry.After whose wait is already over: the retries run at
// once, whatever backoff they computed.
func elapsed(time.Duration) <-chan time.Time {
	c := make(chan time.Time, 1)
	c <- time.Time{}
	return c
}

func TestRewritingTokenFileBetweenRPCsChangesTokenOnSecond(t *testing.T) {
	d := newDoor(t)
	path := filepath.Join(t.TempDir(), "token")
	clk := newClock()
	first, second := signedToken(t, clk.Now().Add(10*time.Minute)), signedToken(t, clk.Now().Add(20*time.Minute))
	writeFile(t, path, first)
	client := d.unaryClient(NewFileToken(path, slog.New(slog.DiscardHandler), clk.Now))
	ctx := context.Background()
	if _, err := client.CallUnary(ctx, connect.NewRequest(wrapperspb.String("1"))); err != nil {
		t.Fatal(err)
	}
	writeFile(t, path, second)
	if _, err := client.CallUnary(ctx, connect.NewRequest(wrapperspb.String("2"))); err != nil {
		t.Fatal(err)
	}
	got := d.seen()
	if len(got) != 2 || got[0] != "Bearer "+first || got[1] != "Bearer "+second {
		t.Fatalf("the server saw %d headers; first matches %v, second matches the rewritten token %v",
			len(got), len(got) > 0 && got[0] == "Bearer "+first, len(got) > 1 && got[1] == "Bearer "+second)
	}
}

func TestBearerUnaryReturnsTokenSourceError(t *testing.T) {
	d := newDoor(t)
	path := filepath.Join(t.TempDir(), "missing")
	client := d.unaryClient(NewFileToken(path, slog.New(slog.DiscardHandler), nil))
	_, err := client.CallUnary(context.Background(), connect.NewRequest(wrapperspb.String("x")))
	if !errors.Is(err, ErrTokenUnavailable) || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("err = %v, want the token source's ErrTokenUnavailable", err)
	}
	if n := len(d.seen()); n != 0 {
		t.Fatalf("the call reached the Server %d times without a token", n)
	}
}

func TestBearerStreamSendsNoHeaderWhenSourceFails(t *testing.T) {
	d := newDoor(t)
	path := filepath.Join(t.TempDir(), "token")
	tok := mintedToken(t)
	writeFile(t, path, tok)
	log, logs := newLog(t)
	src := NewFileToken(path, log, nil)
	client := connect.NewClient[wrapperspb.StringValue, wrapperspb.StringValue](d.srv.Client(), d.srv.URL+echoStream,
		connect.WithGRPC(), connect.WithInterceptors(NewBearerInterceptor(src, log)))
	stream := func() {
		t.Helper()
		s, err := client.CallServerStream(context.Background(), connect.NewRequest(wrapperspb.String("x")))
		if err != nil {
			t.Fatal(err)
		}
		for s.Receive() {
		}
		if err := s.Err(); err != nil {
			t.Fatal(err)
		}
		s.Close()
	}
	stream()
	os.Remove(path) // a minted token has no exp: no fallback
	stream()
	got := d.seen()
	if len(got) != 2 || got[0] != "Bearer "+tok || got[1] != "" {
		t.Fatalf("headers: %d seen; first has the token %v; second empty %v", len(got), len(got) > 0 && got[0] == "Bearer "+tok, len(got) > 1 && got[1] == "")
	}
	if !strings.Contains(logs.String(), "no token for stream") {
		t.Fatalf("the failure is not logged:\n%s", logs)
	}
	assertNoToken(t, logs.String(), tok)
}

func TestRetryUnavailableWithCappedJitteredBackoff(t *testing.T) {
	d := newDoor(t)
	path := filepath.Join(t.TempDir(), "token")
	writeFile(t, path, mintedToken(t))
	client := d.unaryClient(NewFileToken(path, nil, nil))
	var ceilings []time.Duration
	r := Retry{Base: 100 * time.Millisecond, Max: 400 * time.Millisecond, Logger: slog.New(slog.DiscardHandler),
		Jitter: func(d time.Duration) time.Duration { ceilings = append(ceilings, d); return d / 2 },
		After:  elapsed}
	call := echoCall(client)

	d.fail = []connect.Code{connect.CodeUnavailable, connect.CodeUnavailable, connect.CodeUnavailable, connect.CodeUnavailable}
	if err := r.Do(context.Background(), "Echo", call); err != nil {
		t.Fatalf("after four Unavailable: %v", err)
	}
	want := []time.Duration{100, 200, 400, 400}
	for i := range want {
		want[i] *= time.Millisecond
	}
	if len(ceilings) != 4 || ceilings[0] != want[0] || ceilings[1] != want[1] || ceilings[2] != want[2] || ceilings[3] != want[3] {
		t.Fatalf("backoff ceilings = %v, want %v", ceilings, want)
	}
	if n := len(d.seen()); n != 5 {
		t.Fatalf("%d attempts, want 5", n)
	}

	d.fail = []connect.Code{connect.CodeUnauthenticated}
	before := len(d.seen())
	err := r.Do(context.Background(), "Echo", call)
	if connect.CodeOf(err) != connect.CodeUnauthenticated || len(d.seen())-before != 1 {
		t.Fatalf("Unauthenticated: err %v after %d attempts, want no retry", err, len(d.seen())-before)
	}
}

func TestRetryBoundsEachAttempt(t *testing.T) {
	d := newDoor(t)
	d.block = true
	path := filepath.Join(t.TempDir(), "token")
	writeFile(t, path, mintedToken(t))
	client := d.unaryClient(NewFileToken(path, nil, nil))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	attempts := 0
	r := Retry{AttemptTimeout: 50 * time.Millisecond, Logger: slog.New(slog.DiscardHandler),
		Jitter: func(time.Duration) time.Duration { return 0 },
		After: func(time.Duration) <-chan time.Time {
			attempts++
			c := make(chan time.Time, 1)
			if attempts == 3 {
				cancel() // the caller gives up during the third wait
			}
			c <- time.Time{}
			return c
		}}
	calls := 0
	err := r.Do(ctx, "Echo", func(actx context.Context) error {
		calls++
		dl, ok := actx.Deadline()
		if !ok || time.Until(dl) > 50*time.Millisecond {
			t.Errorf("attempt %d is not bounded by the attempt timeout", calls)
		}
		_, err := client.CallUnary(actx, connect.NewRequest(wrapperspb.String("x")))
		if connect.CodeOf(err) != connect.CodeDeadlineExceeded {
			t.Errorf("attempt %d: err = %v, want deadline exceeded", calls, err)
		}
		return err
	})
	if !errors.Is(err, context.Canceled) || connect.CodeOf(err) != connect.CodeDeadlineExceeded {
		t.Fatalf("err = %v, want the caller's cancellation with the last attempt's deadline", err)
	}
	if calls != 3 {
		t.Fatalf("%d attempts, want 3 (each cut at its own timeout)", calls)
	}
}

func TestDoorHTTPClient(t *testing.T) {
	d := newDoor(t)
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	writeFile(t, caFile, string(pemOf(t, d.srv)))
	hc, err := DoorHTTPClient(d.srv.URL, caFile)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "token")
	writeFile(t, path, mintedToken(t))
	client := connect.NewClient[wrapperspb.StringValue, wrapperspb.StringValue](hc, d.srv.URL+echoUnary,
		connect.WithGRPC(), connect.WithInterceptors(NewBearerInterceptor(NewFileToken(path, nil, nil), nil)))
	if _, err := client.CallUnary(context.Background(), connect.NewRequest(wrapperspb.String("x"))); err != nil {
		t.Fatalf("with --ca-file: %v", err)
	}
	noCA, _ := DoorHTTPClient(d.srv.URL, "")
	client = connect.NewClient[wrapperspb.StringValue, wrapperspb.StringValue](noCA, d.srv.URL+echoUnary, connect.WithGRPC())
	if _, err := client.CallUnary(context.Background(), connect.NewRequest(wrapperspb.String("x"))); err == nil {
		t.Fatal("an untrusted certificate was accepted")
	}
	for _, bad := range []string{"http://server:8443", "server:8443", ""} {
		if _, err := DoorHTTPClient(bad, ""); err == nil {
			t.Fatalf("DoorHTTPClient(%q) accepted", bad)
		}
	}
}

// pemOf is the PEM of the httptest server's certificate (self-signed, so it
// is its own CA).
func pemOf(t *testing.T, srv *httptest.Server) []byte {
	t.Helper()
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
}
