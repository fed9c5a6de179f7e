package natsurl

import (
	"errors"
	"strings"
	"testing"
)

func TestCheckSealed(t *testing.T) {
	for _, tc := range []struct {
		urls string
		want error
		msg  string
	}{
		{"tls://nats.example.com:4222", nil, ""},
		{"wss://nats.example.com:443", nil, ""},
		{"nats://127.0.0.1:4222", nil, ""},
		{"nats://127.9.9.9:4222", nil, ""},
		{"nats://[::1]:4222", nil, ""},
		{"nats://localhost:4222", nil, ""},
		{"127.0.0.1:4222", nil, ""},
		{"tls://a:4222, tls://b:4222", nil, ""},
		{"nats://nats.example.com:4222", ErrPlaintext, "nats://nats.example.com:4222"},
		{"ws://10.0.0.1:8080", ErrPlaintext, "ws://10.0.0.1:8080"},
		{"nats.example.com:4222", ErrPlaintext, "nats://nats.example.com:4222"},
		{"tls://a:4222,nats://b:4222", ErrPlaintext, "nats://b:4222"},
		{"nats://user:secret@nats.example.com:4222", ErrPlaintext, "non-loopback host (use tls:// or wss://): nats://nats.example.com:4222"},
		{"nats://secret@nats.example.com:4222", ErrPlaintext, "non-loopback host (use tls:// or wss://): nats://nats.example.com:4222"},
		{"tls://a:4222,nats://user:secret@b:bad", nil, "natsurl: NATS URL 2 of the list is not a valid URL"},
		{"nats://localhost.example.com:4222", ErrPlaintext, ""},
		{"http://nats.example.com", nil, `unknown scheme "http"`},
	} {
		err := CheckSealed(tc.urls)
		switch {
		case tc.want == nil && tc.msg == "" && err != nil:
			t.Errorf("%q: %v", tc.urls, err)
		case tc.want != nil && !errors.Is(err, tc.want):
			t.Errorf("%q: %v, want %v", tc.urls, err, tc.want)
		case tc.msg != "" && (err == nil || !strings.Contains(err.Error(), tc.msg)):
			t.Errorf("%q: %v, want it to say %q", tc.urls, err, tc.msg)
		}
		if err != nil && strings.Contains(err.Error(), "secret") {
			t.Errorf("%q: the error shows the password: %v", tc.urls, err)
		}
	}
}

// Redact shows a URL list with every credential masked: a password as
// url.URL.Redacted masks it, a lone user (a token to nats.go) too, and a URL
// that does not parse not at all.
func TestRedact(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"nats://a.example:4222", "nats://a.example:4222"},
		{"a.example:4222", "nats://a.example:4222"},
		{"tls://user:secret@a:4222", "tls://user:xxxxx@a:4222"},
		{"nats://user:@a:4222", "nats://user:xxxxx@a:4222"},
		{"nats://secret@a.example:4222", "nats://xxxxx@a.example:4222"},
		{"secret@a.example:4222", "nats://xxxxx@a.example:4222"},
		{"user:secret@a.example:4222", "nats://user:xxxxx@a.example:4222"},
		{"wss://user:p%40secret@a:443", "wss://user:xxxxx@a:443"},
		{" tls://a:4222 , ,nats://u:secret@127.0.0.1:4222", "tls://a:4222,nats://u:xxxxx@127.0.0.1:4222"},
		{"tls://a:4222,nats://user:secret@b:bad", "tls://a:4222,(unparsable URL)"},
		{"nats://secret%zz@a.example:1", "(unparsable URL)"},
	} {
		got := Redact(tc.in)
		if got != tc.want {
			t.Errorf("Redact(%q) = %q, want %q", tc.in, got, tc.want)
		}
		if strings.Contains(got, "secret") {
			t.Errorf("Redact(%q) = %q shows the secret", tc.in, got)
		}
	}
}

// StripUser removes every user part and says so; a list without one comes
// back exactly as given.
func TestStripUser(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		had      bool
	}{
		{"", "", false},
		{"tls://a:4222, tls://b:4222", "tls://a:4222, tls://b:4222", false},
		{"tls://user:secret@a:4222", "tls://a:4222", true},
		{"nats://secret@127.0.0.1:4222", "nats://127.0.0.1:4222", true},
		{"secret@127.0.0.1:4222", "nats://127.0.0.1:4222", true},
		{"tls://a:4222, wss://u:secret@b:443,", "tls://a:4222,wss://b:443", true},
		{"tls://a:4222,nats://user:secret@b:bad", "tls://a:4222,nats://user:secret@b:bad", false},
	} {
		got, had := StripUser(tc.in)
		if got != tc.want || had != tc.had {
			t.Errorf("StripUser(%q) = %q, %v; want %q, %v", tc.in, got, had, tc.want, tc.had)
		}
	}
}

// CheckParse names the first URL that does not parse by its position, never
// by its text.
func TestCheckParse(t *testing.T) {
	for in, want := range map[string]string{
		"nats://a:4222":                   "",
		"a:4222, tls://u:p@b:4222":        "",
		" , nats://a:1":                   "",
		"nats://a:1,nats://s3cr3t%zz@b:1": "natsurl: NATS URL 2 of the list is not a valid URL",
		"s3cr3t%zz@b:1":                   "natsurl: NATS URL 1 of the list is not a valid URL",
	} {
		err := CheckParse(in)
		switch {
		case want == "" && err != nil:
			t.Errorf("CheckParse(%q) = %v, want nil", in, err)
		case want != "" && (err == nil || err.Error() != want):
			t.Errorf("CheckParse(%q) = %v, want %q", in, err, want)
		}
	}
}
