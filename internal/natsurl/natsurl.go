// Package natsurl decides whether a NATS URL list keeps a token sealed: a
// Runner sends its token in CONNECT, and that token is valid at the TLS-only
// door for up to exp plus the leeway, so it must never cross a network in
// clear text. The attacker is anyone on the path between a Runner and NATS.
package natsurl

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
)

// ErrPlaintext is returned for a nats:// or ws:// URL to a host that is not
// loopback.
var ErrPlaintext = errors.New("natsurl: plaintext NATS URL to a non-loopback host (use tls:// or wss://)")

// CheckSealed checks every URL of a comma-separated list: tls:// and wss://
// pass; nats:// and ws:// (and a URL without a scheme, which nats.go reads as
// nats://) pass only to a loopback host. Errors name the URL without any user
// information: nats.go reads a URL's user part as credentials, a lone user
// as a token.
func CheckSealed(urls string) error {
	for i, raw := range strings.Split(urls, ",") {
		raw = strings.TrimSpace(raw)
		if raw == "" {
			continue
		}
		if !strings.Contains(raw, "://") {
			raw = "nats://" + raw
		}
		u, err := url.Parse(raw)
		if err != nil {
			// url.Parse's error quotes the whole URL, credentials included.
			return fmt.Errorf("natsurl: NATS URL %d of the list is not a valid URL", i+1)
		}
		u.User = nil
		switch strings.ToLower(u.Scheme) {
		case "tls", "wss":
			continue
		case "nats", "ws":
			if Loopback(u.Hostname()) {
				continue
			}
			return fmt.Errorf("%w: %s", ErrPlaintext, u.Redacted())
		default:
			return fmt.Errorf("natsurl: %s: unknown scheme %q (want tls://, wss://, or nats:// to loopback)", u.Redacted(), u.Scheme)
		}
	}
	return nil
}

// Loopback reports whether host is "localhost" or a loopback IP address.
func Loopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
