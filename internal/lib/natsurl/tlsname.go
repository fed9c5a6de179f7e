package natsurl

import (
	"crypto/tls"
	"net"
	"strings"

	"github.com/nats-io/nats.go"
)

// TLSServerName is a nats.Option that has every TLS handshake of a
// connection verify the server's certificate against the one host name of
// the configured URLs (urls, comma-separated), whatever address it dials.
//
// The failure it prevents: nats.go learns the other servers of a cluster
// from INFO as bare addresses (in Kubernetes, pod IPs) and verifies each
// against the host name of the URL it is connected to when it learns them.
// When that is itself a learned address, the name is an IP, which a
// certificate for the Service's DNS names does not carry: every server that
// (re)started while the client was on a learned address fails the
// handshake ("x509: cannot validate certificate for 10.0.0.7 because it
// doesn't contain any IP SANs"). In a rolling restart of NATS that can be
// every address but the Service's, and a client whose pool tries those
// first waits its reconnect delay before the Service's name comes round
// (a Runner: 2 to 22 s off NATS instead of none).
//
// Pinning the name verifies each learned server against the name the
// operator configured, which is what nats.go does anyway while it is on
// that name; an address learned from a verified server's INFO is no more
// trusted than before, since its certificate must still carry the name.
// With no host name among the URLs (IPs only), or more than one, the option
// changes nothing and nats.go's own choice stands. A ServerName already in
// the options' TLS configuration is kept.
func TLSServerName(urls string) nats.Option {
	name := sharedHostName(urls)
	return func(o *nats.Options) error {
		if name == "" {
			return nil
		}
		switch {
		case o.TLSConfig == nil:
			o.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12, ServerName: name}
		case o.TLSConfig.ServerName == "":
			// A copy: the configuration may be the caller's, shared.
			c := o.TLSConfig.Clone()
			c.ServerName = name
			o.TLSConfig = c
		}
		return nil
	}
}

// sharedHostName is the one DNS host name of the tls:// and wss:// URLs of
// urls, "" when they have none or several. Plaintext URLs never verify a
// name (CheckSealed admits them only to loopback).
func sharedHostName(urls string) string {
	name := ""
	for _, raw := range strings.Split(urls, ",") {
		if strings.TrimSpace(raw) == "" {
			continue
		}
		u, err := parse(raw)
		if err != nil {
			return ""
		}
		switch strings.ToLower(u.Scheme) {
		case "tls", "wss":
		default:
			continue
		}
		h := u.Hostname()
		if h == "" || net.ParseIP(h) != nil {
			continue
		}
		switch {
		case name == "":
			name = h
		case !strings.EqualFold(name, h):
			return ""
		}
	}
	return name
}
