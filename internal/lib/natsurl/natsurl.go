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
		if strings.TrimSpace(raw) == "" {
			continue
		}
		u, err := parse(raw)
		if err != nil {
			// The index, never the URL: it may hold credentials.
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

// redactedMask is what url.URL.Redacted shows in place of a password;
// Redact shows it in place of a lone user too, which nats.go sends as a token.
const redactedMask = "xxxxx"

// unparsable stands in for a URL that does not parse: its text, and
// url.Parse's error, would show whatever credentials it holds.
const unparsable = "(unparsable URL)"

// Redact returns a comma-separated NATS URL list fit for a log line or an
// error: each URL as url.URL.Redacted shows it (user:xxxxx@), a lone user
// part masked as well (xxxxx@), a URL without a scheme with the nats:// that
// nats.go reads it with, and a URL that does not parse as "(unparsable URL)".
// Blank entries are left out.
func Redact(urls string) string {
	var out []string
	for _, raw := range strings.Split(urls, ",") {
		if strings.TrimSpace(raw) == "" {
			continue
		}
		u, err := parse(raw)
		switch {
		case err != nil:
			out = append(out, unparsable)
			continue
		case u.User == nil:
		case hasPassword(u.User):
			u.User = url.UserPassword(u.User.Username(), redactedMask)
		default:
			u.User = url.User(redactedMask)
		}
		out = append(out, u.String())
	}
	return strings.Join(out, ",")
}

// StripUser returns urls with the user part of each URL removed, and whether
// any URL had one: a URL handed on to someone else (the NATS URL Enroll tells
// every Runner) must not carry the credentials of whoever configured it. When
// no URL has a user part, urls is returned as it is. A URL that does not parse
// is kept as it is: CheckSealed refuses it, so check a list with CheckSealed
// before handing on what StripUser returns.
func StripUser(urls string) (string, bool) {
	entries := strings.Split(urls, ",")
	had := false
	for i, raw := range entries {
		if strings.TrimSpace(raw) == "" {
			continue
		}
		u, err := parse(raw)
		if err != nil || u.User == nil {
			continue
		}
		u.User = nil
		entries[i], had = u.String(), true
	}
	if !had {
		return urls, false
	}
	var out []string
	for _, e := range entries {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return strings.Join(out, ","), true
}

// CheckParse reports the first URL of a comma-separated list that does not
// parse, by its position in the list: the URL itself may hold credentials,
// and url.Parse's error would quote it.
func CheckParse(urls string) error {
	for i, raw := range strings.Split(urls, ",") {
		if strings.TrimSpace(raw) == "" {
			continue
		}
		if _, err := parse(raw); err != nil {
			return fmt.Errorf("natsurl: NATS URL %d of the list is not a valid URL", i+1)
		}
	}
	return nil
}

// parse parses one URL of a list as nats.go does: trimmed, and a URL without
// a scheme as nats://. Its error never quotes the URL.
func parse(raw string) (*url.URL, error) {
	raw = strings.TrimSpace(raw)
	if !strings.Contains(raw, "://") {
		raw = "nats://" + raw
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, errors.New("natsurl: not a valid URL")
	}
	return u, nil
}

func hasPassword(u *url.Userinfo) bool {
	_, ok := u.Password()
	return ok
}

// Loopback reports whether host is "localhost" or a loopback IP address.
func Loopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
