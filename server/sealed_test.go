package server

import (
	"errors"
	"testing"

	"github.com/compass-runner/identity/internal/lib/natsurl"
)

// serve refuses to tell Runners a NATS URL that would carry their token in
// clear text to another host, before it opens anything.
func TestServeRefusesPlaintextRunnerNATSURL(t *testing.T) {
	for _, tc := range []struct {
		cfg  ServeConfig
		want string
	}{
		{ServeConfig{RunnerNATSURL: "nats://nats.example.com:4222"},
			"server: the NATS URL Enroll tells Runners (--runner-nats-url, default --nats-url): natsurl: plaintext NATS URL to a non-loopback host (use tls:// or wss://): nats://nats.example.com:4222"},
		{ServeConfig{NATS: NATSConfig{URL: "nats://u:secret@10.0.0.7:4222"}},
			"server: the NATS URL Enroll tells Runners (--runner-nats-url, default --nats-url): natsurl: plaintext NATS URL to a non-loopback host (use tls:// or wss://): nats://10.0.0.7:4222"},
		{ServeConfig{NATS: NATSConfig{URL: "nats://127.0.0.1:4222"}, RunnerNATSURL: "ws://nats.example.com"},
			"server: the NATS URL Enroll tells Runners (--runner-nats-url, default --nats-url): natsurl: plaintext NATS URL to a non-loopback host (use tls:// or wss://): ws://nats.example.com"},
	} {
		dir := t.TempDir()
		tc.cfg.DataDir, tc.cfg.TLSCert, tc.cfg.TLSKey = dir, "missing.crt", "missing.key"
		err := Serve(t.Context(), tc.cfg)
		if err == nil || err.Error() != tc.want || !errors.Is(err, natsurl.ErrPlaintext) {
			t.Errorf("Serve: %v\nwant %s", err, tc.want)
		}
	}
}
