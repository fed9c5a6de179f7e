package server

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"
)

// CertCheckEvery is how often the door's certificate files are checked for
// a change. cert-manager and similar tools renew days before expiry, so a
// minute's delay is nothing, and a stat per minute costs nothing.
const CertCheckEvery = time.Minute

// certReloader serves the door's certificate from files and picks up a
// renewed pair without a restart. A pair that fails to load keeps the last
// good one in service (and is logged).
type certReloader struct {
	certFile, keyFile string
	now               func() time.Time
	log               *slog.Logger

	mu        sync.Mutex
	cert      *tls.Certificate
	certMod   time.Time
	keyMod    time.Time
	checkedAt time.Time
}

func newCertReloader(certFile, keyFile string, now func() time.Time, log *slog.Logger) (*certReloader, error) {
	r := &certReloader{certFile: certFile, keyFile: keyFile, now: now, log: log}
	if err := r.load(); err != nil {
		return nil, err
	}
	r.checkedAt = now()
	return r, nil
}

func modTime(path string) (time.Time, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return time.Time{}, err
	}
	return fi.ModTime(), nil
}

// load reads the pair. r.mu must be held, or r not yet shared.
func (r *certReloader) load() error {
	cm, err := modTime(r.certFile)
	if err != nil {
		return fmt.Errorf("server: TLS certificate: %w", err)
	}
	km, err := modTime(r.keyFile)
	if err != nil {
		return fmt.Errorf("server: TLS key: %w", err)
	}
	cert, err := tls.LoadX509KeyPair(r.certFile, r.keyFile)
	if err != nil {
		return fmt.Errorf("server: load TLS key pair: %w", err)
	}
	r.cert, r.certMod, r.keyMod = &cert, cm, km
	return nil
}

// GetCertificate is tls.Config.GetCertificate.
func (r *certReloader) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	if now.Sub(r.checkedAt) < CertCheckEvery {
		return r.cert, nil
	}
	r.checkedAt = now
	cm, cerr := modTime(r.certFile)
	km, kerr := modTime(r.keyFile)
	if cerr == nil && kerr == nil && cm.Equal(r.certMod) && km.Equal(r.keyMod) {
		return r.cert, nil
	}
	if err := r.load(); err != nil {
		r.log.Warn("server: TLS key pair changed but does not load; serving the previous one", "err", err)
		return r.cert, nil
	}
	r.log.Info("server: TLS key pair reloaded", "cert", r.certFile)
	return r.cert, nil
}
