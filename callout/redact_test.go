package callout

import "testing"

// URLs are logged without credentials: a password, or a lone user (which
// nats.go sends as a token), becomes "redacted"; a URL without a scheme is
// shown as nats.go reads it; one that does not parse is not shown at all.
func TestRedactURL(t *testing.T) {
	for in, want := range map[string]string{
		"nats://a.example:4222":        "nats://a.example:4222",
		"a.example:4222":               "nats://a.example:4222",
		"tls://user:s3cr3t@a:4222":     "tls://redacted@a:4222",
		"s3cr3t-token@a.example:4222":  "nats://redacted@a.example:4222",
		"nats://s3cr3t%zz@a.example:1": "(unparsable URL)",
	} {
		if got := redactURL(in); got != want {
			t.Errorf("redactURL(%q) = %q, want %q", in, got, want)
		}
	}
}
