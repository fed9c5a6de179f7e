// Package doorhttp builds the HTTP client that callers of the Server's door
// (compass-runner, and compass-server's own admin commands) share.
package doorhttp

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
)

// ErrServerURL marks a --server value that is not an https:// URL.
var ErrServerURL = errors.New("--server must be an https:// URL")

// Client returns the HTTP client for the door at serverURL. It is HTTPS only:
// a bearer token goes with every call and must never cross plaintext. It
// allows HTTP/2, which gRPC needs, and trusts the system roots plus the PEM
// certificates in caFile when that is set.
func Client(serverURL, caFile string) (*http.Client, error) {
	u, err := url.Parse(serverURL)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("--server %q: not a URL: %w", serverURL, ErrServerURL)
	}
	if u.Scheme != "https" {
		return nil, fmt.Errorf("--server %q: must be https:// (a token goes with every call): %w", serverURL, ErrServerURL)
	}
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("--ca-file: %w", err)
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--ca-file %s: no PEM certificate in it", caFile)
		}
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	tr.ForceAttemptHTTP2 = true
	return &http.Client{Transport: tr}, nil
}
