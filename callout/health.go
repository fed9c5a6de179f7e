package callout

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/compass-runner/identity/internal/lib/healthz"
	"github.com/compass-runner/identity/store"
	"github.com/compass-runner/identity/verifier"
)

// ReadyStoreTimeout bounds the store query of one readiness check: under
// kubelet's default probe timeout (1 s), so a database that hangs is a 503
// that says so rather than a probe timeout that says nothing.
const ReadyStoreTimeout = 800 * time.Millisecond

// readiness is what /readyz reports: the callout is ready when it answers
// requests (subscribed, every NATS connection up) and can authorize
// something: at least one cluster's keys are usable, or the minted-token
// store answers. A callout whose every cluster lacks keys and that has no
// store answers every request "keys unavailable" or "unknown token", so it
// must not take traffic from a replica that can authorize.
type readiness struct {
	subscribed atomic.Bool
	// conns are the NATS connections, set once they are up: /healthz and
	// /readyz serve while the callout still waits for NATS, so a liveness
	// probe does not restart a callout that waits for a server.
	conns    atomic.Pointer[[]*nats.Conn]
	clusters *verifier.RunnerVerifier // nil: no --runner-clusters
	store    store.Store              // nil: no --database-url
}

// Check returns nil when ready, or an error with one line per failing check.
// The lines hold cluster names, key-load reasons and store errors, never a
// token, a seed or a password (database drivers redact it).
func (r *readiness) Check(ctx context.Context) error {
	var errs []error
	if !r.subscribed.Load() {
		errs = append(errs, errors.New("responder: not subscribed"))
	}
	conns := r.conns.Load()
	if conns == nil {
		errs = append(errs, errors.New("nats: not connected yet (waiting for a server)"))
	} else {
		for i, nc := range *conns {
			if !nc.IsConnected() {
				errs = append(errs, fmt.Errorf("nats: connection %d not connected (%s)", i, nc.Status()))
			}
		}
	}
	var why []error
	if r.clusters != nil {
		err := usableCluster(r.clusters.Status())
		if err == nil {
			return errors.Join(errs...)
		}
		why = append(why, err)
	}
	if r.store != nil {
		err := r.checkStore(ctx)
		if err == nil {
			return errors.Join(errs...)
		}
		why = append(why, err)
	}
	return errors.Join(append(errs, why...)...)
}

// usableCluster is nil when a cluster's keys are usable, or says why none is.
func usableCluster(st []verifier.ClusterStatus) error {
	if len(st) == 0 {
		return errors.New("clusters: none registered")
	}
	var parts []string
	for _, s := range st {
		if s.Usable {
			return nil
		}
		p := s.Name + ": " + s.Reason
		if s.LastError != "" {
			p += " (last fetch: " + s.LastError + ")"
		}
		parts = append(parts, p)
	}
	return fmt.Errorf("clusters: no cluster has usable keys: %s", oneLine(strings.Join(parts, "; ")))
}

func (r *readiness) checkStore(ctx context.Context) error {
	return store.Ready(ctx, r.store, ReadyStoreTimeout)
}

// oneLine keeps a reason on its line.
func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// serveHealth serves /metrics, /healthz and /readyz on addr (none when addr
// is empty). ready reports why the callout is not ready, or nil: /readyz is
// then 503 with one line per failing check.
func serveHealth(addr string, reg *prometheus.Registry, ready func(context.Context) error, log *slog.Logger) (*http.Server, string, error) {
	if addr == "" {
		return nil, "", nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, "", fmt.Errorf("callout: --metrics-addr: %w", err)
	}
	return serveHealthOn(ln, reg, ready, log), ln.Addr().String(), nil
}

// serveHealthOn is serveHealth on a listener of the caller's; an accept
// failure other than the server's own close is logged.
func serveHealthOn(ln net.Listener, reg *prometheus.Registry, ready func(context.Context) error, log *slog.Logger) *http.Server {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("GET /readyz", healthz.Ready(ready))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("callout: metrics server", "error", err)
		}
	}()
	return srv
}
