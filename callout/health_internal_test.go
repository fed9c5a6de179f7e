package callout

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The metrics listener closes a connection that sends no request headers
// within 5 s (slowloris): a client that opens connections and says nothing
// cannot hold them.
func TestHealthListenerDropsSilentClients(t *testing.T) {
	t.Parallel() // waits out the real 5 s
	srv, addr, err := serveHealth("127.0.0.1:0", prometheus.NewRegistry(), func(context.Context) error { return nil }, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	_ = c.SetReadDeadline(start.Add(15 * time.Second))
	_, err = c.Read(make([]byte, 1))
	took := time.Since(start)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("a silent connection was still open after %s", took)
	}
	if !errors.Is(err, io.EOF) || took < 4*time.Second {
		t.Fatalf("after %s: %v, want the server to close the connection at 5 s", took, err)
	}
}

// brokenListener fails every Accept, as a listener whose socket went away.
type brokenListener struct{ net.Listener }

func (brokenListener) Accept() (net.Conn, error) { return nil, errors.New("accept: socket gone") }

// A metrics listener that fails is logged (the endpoints are gone; the
// callout goes on answering); the server's own close is not.
func TestHealthListenerFailureIsLogged(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	logged := make(chan slog.Record, 1)
	log := slog.New(recordHandler(func(r slog.Record) { logged <- r }))
	srv := serveHealthOn(brokenListener{ln}, prometheus.NewRegistry(), func(context.Context) error { return nil }, log)
	defer srv.Close()
	select {
	case r := <-logged:
		var cause string
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "error" {
				cause = a.Value.String()
			}
			return true
		})
		if r.Message != "callout: metrics server" || r.Level != slog.LevelError || cause != "accept: socket gone" {
			t.Fatalf("logged %s %q (error %q)", r.Level, r.Message, cause)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the failing listener was not logged")
	}
}

// recordHandler hands every record to f.
type recordHandler func(slog.Record)

func (h recordHandler) Enabled(context.Context, slog.Level) bool      { return true }
func (h recordHandler) Handle(_ context.Context, r slog.Record) error { h(r); return nil }
func (h recordHandler) WithAttrs([]slog.Attr) slog.Handler            { return h }
func (h recordHandler) WithGroup(string) slog.Handler                 { return h }
