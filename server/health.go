package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/compass-runner/identity/internal/lib/healthz"
	"github.com/compass-runner/identity/store"
)

// ReadyStoreTimeout bounds the store query of one readiness check. It is
// under kubelet's default probe timeout (1 s), so a database that hangs is
// reported as a 503 that says so rather than as a probe timeout that says
// nothing; a healthy database answers the query in milliseconds.
const ReadyStoreTimeout = 800 * time.Millisecond

// readiness is what /readyz and the door's grpc.health.v1 report: whether
// the door can serve a Runner or an operator now. It is the door's own parts
// only, the store and the certificate. NATS is not one of them: Enroll,
// ListRunners and token checks need no NATS, so a NATS outage must not take
// every Server replica out of its Service (which would turn a NATS outage
// into a door outage as well). NATS is reported beside it instead (natsHealth:
// a metric and a /healthz line).
type readiness struct {
	store store.Store
	// cert is what the door's next TLS handshake would serve.
	cert func() (*tls.Certificate, error)
	now  func() time.Time
	log  *slog.Logger

	mu   sync.Mutex
	last string // the reasons of the previous check, to log changes only
}

func newReadiness(st store.Store, tc *tls.Config, now func() time.Time, log *slog.Logger) *readiness {
	cert := func() (*tls.Certificate, error) {
		if tc.GetCertificate != nil {
			return tc.GetCertificate(&tls.ClientHelloInfo{})
		}
		if len(tc.Certificates) > 0 {
			return &tc.Certificates[0], nil
		}
		return nil, nil
	}
	return &readiness{store: st, cert: cert, now: now, log: log}
}

// Check returns nil when the door is ready, or an error with one line per
// failing check, each naming the part: the store answers a query within
// ReadyStoreTimeout, and the door has a certificate valid now. The lines
// hold no secret: a database error names the database at most, never its
// password (drivers redact it).
func (r *readiness) Check(ctx context.Context) error {
	var errs []error
	if err := r.checkStore(ctx); err != nil {
		errs = append(errs, err)
	}
	if err := r.checkCert(); err != nil {
		errs = append(errs, err)
	}
	err := errors.Join(errs...)
	r.logChange(err)
	return err
}

// MetricNATSConnected is the Server's NATS connection state: 1 connected, 0
// not (reconnecting, or closed). Absent without --nats-url.
const MetricNATSConnected = "compass_server_nats_connected"

// natsHealth reports the Server's NATS connection apart from readiness:
// what needs NATS (PingRunner, last_seen) degrades while it is down, the
// door does not.
type natsHealth struct {
	nc *nats.Conn // nil: no --nats-url
}

// line is the /healthz line for NATS, "" without --nats-url.
func (h natsHealth) line() string {
	switch {
	case h.nc == nil:
		return ""
	case h.nc.IsConnected():
		return "nats: connected"
	default:
		return fmt.Sprintf("nats: not connected (%s)", h.nc.Status())
	}
}

// register adds MetricNATSConnected to reg (nothing without --nats-url).
func (h natsHealth) register(reg prometheus.Registerer) error {
	if h.nc == nil {
		return nil
	}
	g := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: MetricNATSConnected,
		Help: "1 while the Server's NATS connection is up, 0 while it is down. Not part of readiness: the door enrolls without NATS; ping-runner and last_seen wait for it.",
	}, func() float64 {
		if h.nc.IsConnected() {
			return 1
		}
		return 0
	})
	if err := reg.Register(g); err != nil {
		return fmt.Errorf("server: metrics: %w", err)
	}
	return nil
}

func (r *readiness) checkStore(ctx context.Context) error {
	return store.Ready(ctx, r.store, ReadyStoreTimeout)
}

func (r *readiness) checkCert() error {
	cert, err := r.cert()
	if err != nil {
		return fmt.Errorf("tls: the door has no certificate: %s", oneLine(err.Error()))
	}
	if cert == nil || len(cert.Certificate) == 0 {
		return errors.New("tls: the door has no certificate")
	}
	leaf := cert.Leaf
	if leaf == nil {
		if leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return fmt.Errorf("tls: the door's certificate does not parse: %s", oneLine(err.Error()))
		}
	}
	now := r.now()
	switch {
	case now.After(leaf.NotAfter):
		return fmt.Errorf("tls: the door's certificate expired at %s", leaf.NotAfter.UTC().Format(time.RFC3339))
	case now.Before(leaf.NotBefore):
		return fmt.Errorf("tls: the door's certificate is not valid before %s", leaf.NotBefore.UTC().Format(time.RFC3339))
	}
	return nil
}

// logChange logs when the readiness or its reasons change, not every probe.
func (r *readiness) logChange(err error) {
	reasons := ""
	if err != nil {
		reasons = strings.ReplaceAll(err.Error(), "\n", "; ")
	}
	r.mu.Lock()
	changed := reasons != r.last
	r.last = reasons
	r.mu.Unlock()
	switch {
	case !changed:
	case err != nil:
		r.log.Warn("server: not ready", "reasons", reasons)
	default:
		r.log.Info("server: ready")
	}
}

// oneLine keeps a reason on its line.
func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// handleHealth serves /healthz (liveness: the process is up and serving
// HTTP, always 200, with a line for NATS when configured, since a NATS
// outage is no reason to restart the Server) and /readyz (ready.Check: 200
// "ready", or 503 with one line per failing check).
func handleHealth(mux *http.ServeMux, ready func(context.Context) error, nh natsHealth) {
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
		if l := nh.line(); l != "" {
			fmt.Fprintln(w, l)
		}
	})
	mux.HandleFunc("GET /readyz", healthz.Ready(ready))
}
