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
