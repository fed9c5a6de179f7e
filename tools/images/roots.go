package main

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"fmt"

	"golang.org/x/crypto/x509roots/fallback/bundle"
)

// caBundle is the PEM file the images carry at /etc/ssl/certs/ca-certificates.crt,
// where Go's crypto/x509 looks first on Linux.
//
// It comes from golang.org/x/crypto/x509roots/fallback, the Mozilla NSS trust
// store as the Go project packages it, at the version tools/images/go.mod pins
// and go.sum checks: every build of a revision carries the same roots,
// whatever machine builds it, and a change of roots is a reviewed go.mod
// change. The build machine's /etc/ssl/certs would make the image depend on
// which machine built it and when its ca-certificates package was updated.
//
// A root NSS constrains (today: distrusted for certificates issued after a
// date) is left out: a PEM file cannot carry the constraint, and a plain
// entry would trust what NSS no longer does.
func caBundle() ([]byte, int, error) {
	var buf bytes.Buffer
	n := 0
	for r := range bundle.Roots() {
		if r.Constraint != nil {
			continue
		}
		if _, err := x509.ParseCertificate(r.Certificate); err != nil {
			return nil, 0, fmt.Errorf("CA bundle: root %d: %w", n, err)
		}
		if err := pem.Encode(&buf, &pem.Block{Type: "CERTIFICATE", Bytes: r.Certificate}); err != nil {
			return nil, 0, fmt.Errorf("CA bundle: %w", err)
		}
		n++
	}
	if n == 0 {
		return nil, 0, fmt.Errorf("CA bundle: x509roots/fallback has no unconstrained root")
	}
	return buf.Bytes(), n, nil
}
