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
