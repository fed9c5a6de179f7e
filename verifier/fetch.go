package verifier

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"

	"github.com/go-jose/go-jose/v4"
)

func (v *RunnerVerifier) newClusterClient(c RunnerCluster, base *http.Client) (*http.Client, error) {
	var rt http.RoundTripper = http.DefaultTransport
	if base != nil && base.Transport != nil {
		rt = base.Transport
	}
	if c.CAFile != "" {
		pem, err := os.ReadFile(c.CAFile)
		if err != nil {
			return nil, fmt.Errorf("caFile: %w", err)
		}
		// caFile is the cluster's whole trust (DL-440): not added to the
		// system roots, so no public CA, nor one a host happens to trust,
		// can vouch for a private issuer's JWKS.
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("caFile: %s holds no PEM certificate", c.CAFile)
		}
		t, ok := rt.(*http.Transport)
		if !ok {
			return nil, errors.New("caFile: the HTTP client's transport is not an *http.Transport")
		}
		t = t.Clone()
		if t.TLSClientConfig == nil {
			t.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		t.TLSClientConfig.RootCAs = pool
		// Clone copies the ALPN list that HTTP/2's set-up wrote into the
		// source's TLS config, but not always that set-up: a clone of a bare
		// *http.Transport offered h2 and then spoke HTTP/1.1, and every fetch
		// failed. The clone offers what it is itself set up for.
		t.TLSClientConfig.NextProtos = nil
		rt = t
	}
	return &http.Client{
		Transport: rt,
		Timeout:   FetchTimeout,
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if req.URL.Scheme != "https" {
				return fmt.Errorf("redirect to non-https URL %s refused", req.URL.Redacted())
			}
			if len(via) > maxRedirects { // via: the requests made so far, the first one included
				return fmt.Errorf("more than %d redirects", maxRedirects)
			}
			return nil
		},
	}, nil
}

func (v *RunnerVerifier) fetchKeys(ctx context.Context, c *cluster) ([]jose.JSONWebKey, error) {
	if c.static {
		return v.readStatic(c)
	}
	jwksURI := c.cfg.JWKSURI
	if jwksURI == "" {
		discURL := strings.TrimSuffix(c.cfg.Issuer, "/") + "/.well-known/openid-configuration"
		body, err := c.get(ctx, discURL)
		if err != nil {
			return nil, fmt.Errorf("discovery: %w", err)
		}
		var disc struct {
			Issuer  string `json:"issuer"`
			JWKSURI string `json:"jwks_uri"`
		}
		if err := json.Unmarshal(body, &disc); err != nil {
			return nil, errors.New("discovery: not a JSON object with issuer and jwks_uri")
		}
		if disc.Issuer != c.cfg.Issuer {
			return nil, fmt.Errorf("discovery: issuer %q differs from the configured issuer %q", disc.Issuer, c.cfg.Issuer)
		}
		if disc.JWKSURI == "" {
			return nil, errors.New("discovery: no jwks_uri")
		}
		if err := checkHTTPSURL(disc.JWKSURI, ""); err != nil {
			return nil, fmt.Errorf("discovery: jwks_uri: %w", err)
		}
		jwksURI = disc.JWKSURI
	}
	body, err := c.get(ctx, jwksURI)
	if err != nil {
		return nil, fmt.Errorf("jwks: %w", err)
	}
	return v.parseJWKS(c.cfg.Name, body)
}

func (v *RunnerVerifier) readStatic(c *cluster) ([]jose.JSONWebKey, error) {
	data, err := os.ReadFile(c.cfg.JWKSFile)
	if err != nil {
		return nil, fmt.Errorf("jwksFile: %w", err)
	}
	if len(data) > MaxBodyBytes {
		return nil, fmt.Errorf("jwksFile: larger than %d bytes", MaxBodyBytes)
	}
	keys, err := v.parseJWKS(c.cfg.Name, data)
	if err != nil {
		return nil, fmt.Errorf("jwksFile: %w", err)
	}
	return keys, nil
}

func (c *cluster) get(ctx context.Context, url string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, FetchTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	if req.URL.Scheme != "https" {
		return nil, fmt.Errorf("%s: only https is fetched", req.URL.Redacted())
	}
	// Kubernetes serves the JWKS only as application/jwk-set+json and answers
	// 406 to an Accept that does not list it; discovery is application/json.
	req.Header.Set("Accept", "application/json, application/jwk-set+json")
	resp, err := c.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: status %s", req.URL.Redacted(), resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, MaxBodyBytes+1))
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", req.URL.Redacted(), err)
	}
	if len(body) > MaxBodyBytes {
		return nil, fmt.Errorf("GET %s: body larger than %d bytes", req.URL.Redacted(), MaxBodyBytes)
	}
	return body, nil
}
