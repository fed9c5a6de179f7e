package runner

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/compass-runner/identity/internal/lib/natsurl"
	"github.com/compass-runner/identity/internal/lib/testlog"
)

// enrollerFunc is an Enroller that answers with a fixed result: the seam the
// Runner's own code defines, so the URL the Server returns can be chosen.
type enrollerFunc func(context.Context, EnrollRequest) (EnrollResult, error)

func (f enrollerFunc) Enroll(ctx context.Context, req EnrollRequest) (EnrollResult, error) {
	return f(ctx, req)
}

// A --nats-url that would carry the token in clear text to another host is
// refused at start, without its credentials in the error; tls://, wss:// and
// loopback pass, and so does anything with AllowPlaintextNATS.
func TestPlaintextNATSURLRefusedAtStart(t *testing.T) {
	const hint = "; use tls:// (with --nats-ca-file for a private CA), or --allow-plaintext-nats to send the token unprotected anyway"
	for _, tc := range []struct {
		url, want string
	}{
		{"nats://nats.example.com:4222", "runner: --nats-url: natsurl: plaintext NATS URL to a non-loopback host (use tls:// or wss://): nats://nats.example.com:4222" + hint},
		{"nats.example.com:4222", "runner: --nats-url: natsurl: plaintext NATS URL to a non-loopback host (use tls:// or wss://): nats://nats.example.com:4222" + hint},
		{"ws://u:hunter2@10.1.2.3:8080", "runner: --nats-url: natsurl: plaintext NATS URL to a non-loopback host (use tls:// or wss://): ws://10.1.2.3:8080" + hint},
		{"tls://a.example:4222,nats://b.example:4222", "runner: --nats-url: natsurl: plaintext NATS URL to a non-loopback host (use tls:// or wss://): nats://b.example:4222" + hint},
		{"tls://nats.example.com:4222", ""},
		{"wss://nats.example.com:443", ""},
		{"nats://127.0.0.1:4222", ""},
		{"nats://localhost:4222", ""},
		{"nats://[::1]:4222", ""},
	} {
		_, err := New(Config{RunnerID: "r", Tokens: StaticToken("t"), NATSURL: tc.url})
		got := ""
		if err != nil {
			got = err.Error()
		}
		if got != tc.want {
			t.Errorf("New with %s:\n got %q\nwant %q", tc.url, got, tc.want)
		}
		if tc.want != "" && !errors.Is(err, natsurl.ErrPlaintext) {
			t.Errorf("New with %s: %v is not natsurl.ErrPlaintext", tc.url, err)
		}
		if _, err := New(Config{RunnerID: "r", Tokens: StaticToken("t"), NATSURL: tc.url, AllowPlaintextNATS: true}); err != nil {
			t.Errorf("New with %s and AllowPlaintextNATS: %v", tc.url, err)
		}
	}
}

// A plaintext NATS URL the Server returns at enrollment is refused before any
// connection; with AllowPlaintextNATS the Runner warns, loudly, and connects.
func TestPlaintextNATSURLFromServer(t *testing.T) {
	const plain = "nats://nats.example.com:4222"
	enr := enrollerFunc(func(context.Context, EnrollRequest) (EnrollResult, error) {
		return EnrollResult{RunnerID: "c/n", NATSURL: plain}, nil
	})
	// Every dial lands on this listener, so nothing leaves the machine.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	dialed := make(chan string, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	dialer := dialFunc(func(_, addr string) (net.Conn, error) {
		select {
		case dialed <- addr:
		default:
		}
		return net.Dial("tcp", ln.Addr().String())
	})

	logs := &testlog.Buffer{}
	r, err := New(Config{Tokens: StaticToken("tok"), Enroller: enr, RunnerID: "c", Heartbeat: -1,
		Logger: slog.New(slog.NewTextHandler(logs, nil)), Link: LinkConfig{Options: []nats.Option{nats.SetCustomDialer(dialer)}}})
	if err != nil {
		t.Fatal(err)
	}
	err = r.Run(t.Context())
	want := "runner: the NATS URL would carry the token in clear text: natsurl: plaintext NATS URL to a non-loopback host (use tls:// or wss://): " + plain
	if err == nil || !strings.HasPrefix(err.Error(), want) || !errors.Is(err, natsurl.ErrPlaintext) {
		t.Fatalf("Run: %v\nwant %s...", err, want)
	}
	select {
	case addr := <-dialed:
		t.Fatalf("dialed %s although the URL was refused", addr)
	default:
	}

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	r, err = New(Config{Tokens: StaticToken("tok"), Enroller: enr, RunnerID: "c", Heartbeat: -1, AllowPlaintextNATS: true,
		Logger: slog.New(slog.NewTextHandler(logs, nil)), Link: LinkConfig{Options: []nats.Option{nats.SetCustomDialer(dialer)}}})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	select {
	case addr := <-dialed:
		if addr != "nats.example.com:4222" {
			t.Fatalf("dialed %s", addr)
		}
	case err := <-done:
		t.Fatalf("Run returned %v before connecting", err)
	case <-time.After(10 * time.Second):
		t.Fatalf("no connection attempt:\n%s", logs)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run after cancel: %v", err)
	}
	if !strings.Contains(logs.String(), `level=WARN msg="runner: SENDING THE RUNNER TOKEN IN CLEAR TEXT to a non-loopback NATS server (--allow-plaintext-nats)`) {
		t.Fatalf("no warning:\n%s", logs)
	}
	if strings.Contains(logs.String(), "tok\"") || strings.Contains(logs.String(), "=tok ") {
		t.Fatal("the token appears in the log")
	}
}

type dialFunc func(network, addr string) (net.Conn, error)

func (f dialFunc) Dial(network, addr string) (net.Conn, error) { return f(network, addr) }
