// Package testutil holds the small helpers the project's tests share: a
// bounded poll (Eventually), loopback ports that were free a moment ago
// (FreeAddr, FreePort, FreePorts), an issuer's JWKS that fails on demand
// (FailingJWKS), a TCP proxy that holds what a client sends (Proxy), an
// HTTPS server with HTTP/2 (ServeTLS), an injected clock (Clock), a file
// read for its content (ReadTrim), a daemon's run until the test ends
// (RunUntilCleanup), a counter read from a registry (Counter), a JWT
// re-signed by another nkey (ResignJWT) and a directory's names (DirNames).
//
// It imports no package of this repository, so that every test package can
// import it. Helpers that start NATS live in test/natsembed (Serve,
// ServeOptions, StartProcess), which imports callout.
package testutil

import (
	"os"
	"strings"
	"testing"
)

// ReadTrim reads the file at path (a token or a secret a test was handed)
// without its surrounding white space; the test fails when it cannot.
func ReadTrim(t testing.TB, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}
