package testutil

import (
	"net/http"
	"strings"
	"sync/atomic"
)

// FailingJWKS is fault injection for an issuer's HTTPS handler (it fits
// kubeissuer.Options.Wrap): while it is failing, every request for the key
// set, a path ending in /jwks, is answered 503 Service Unavailable; every
// other request (discovery), and the key set while it is not failing, goes
// through. It is safe for concurrent use.
type FailingJWKS struct {
	failing atomic.Bool
	failed  atomic.Int64
}

// NewFailingJWKS returns a FailingJWKS that fails from the start when failing
// is true.
func NewFailingJWKS(failing bool) *FailingJWKS {
	f := &FailingJWKS{}
	f.failing.Store(failing)
	return f
}

// SetFailing switches the failure on or off for the requests that follow.
func (f *FailingJWKS) SetFailing(on bool) { f.failing.Store(on) }

// Failed is how many key-set requests it has failed.
func (f *FailingJWKS) Failed() int64 { return f.failed.Load() }

// Wrap returns next behind the failure.
func (f *FailingJWKS) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if f.failing.Load() && strings.HasSuffix(r.URL.Path, "/jwks") {
			f.failed.Add(1)
			http.Error(w, "unavailable", http.StatusServiceUnavailable)
			return
		}
		next.ServeHTTP(w, r)
	})
}
