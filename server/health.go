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

	"github.com/compass-runner/identity/internal/healthz"
	"github.com/compass-runner/identity/store"
)

// ReadyStoreTimeout bounds the store query of one readiness check. It is
// under kubelet's default probe timeout (1 s), so a database that hangs is
// reported as a 503 that says so rather than as a probe timeout that says
// nothing; a healthy database answers the query in milliseconds.
const ReadyStoreTimeout = 800 * time.Millisecond

// readiness is what /readyz and the door's grpc.health.v1 report: whether
// the Server can serve a Runner or an operator now.
type readiness struct {
	store store.Store
	// cert is what the door's next TLS handshake would serve.
	cert func() (*tls.Certificate, error)
	nats *nats.Conn // nil: no --nats-url, not checked
	now  func() time.Time
	log  *slog.Logger

	mu   sync.Mutex
	last string // the reasons of the previous check, to log changes only
}

func newReadiness(st store.Store, tc *tls.Config, nc *nats.Conn, now func() time.Time, log *slog.Logger) *readiness {
	cert := func() (*tls.Certificate, error) {
		if tc.GetCertificate != nil {
			return tc.GetCertificate(&tls.ClientHelloInfo{})
		}
		if len(tc.Certificates) > 0 {
			return &tc.Certificates[0], nil
		}
		return nil, nil
	}
	return &readiness{store: st, cert: cert, nats: nc, now: now, log: log}
}

// Check returns nil when the Server is ready, or an error with one line per
// failing check, each naming the part: the store answers a query within
// ReadyStoreTimeout, the door has a certificate valid now, and NATS is
// connected when configured. The lines hold no secret: a database error
// names the database at most, never its password (drivers redact it).
func (r *readiness) Check(ctx context.Context) error {
	var errs []error
	if err := r.checkStore(ctx); err != nil {
		errs = append(errs, err)
	}
	if err := r.checkCert(); err != nil {
		errs = append(errs, err)
	}
	if r.nats != nil && !r.nats.IsConnected() {
		errs = append(errs, fmt.Errorf("nats: not connected (%s)", r.nats.Status()))
	}
	err := errors.Join(errs...)
	r.logChange(err)
	return err
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

// handleHealth serves /healthz (the process is up and serving HTTP) and
// /readyz (ready.Check: 200 "ready", or 503 with one line per failing check).
func handleHealth(mux *http.ServeMux, ready func(context.Context) error) {
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", healthz.Ready(ready))
}
