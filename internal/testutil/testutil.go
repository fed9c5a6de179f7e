// Package testutil holds the small helpers the project's tests share: a
// bounded poll (Eventually), loopback ports that were free a moment ago
// (FreeAddr, FreePort, FreePorts), an issuer's JWKS that fails on demand
// (FailingJWKS) and a TCP proxy that holds what a client sends (Proxy).
//
// It imports no package of this repository, so that every test package can
// import it. Helpers that start NATS live in test/natsembed (Serve,
// ServeOptions, StartProcess), which imports callout.
package testutil
