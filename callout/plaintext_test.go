package callout_test

import (
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/compass-runner/identity/callout"
	"github.com/compass-runner/identity/internal/lib/testlog"
)

// nats-server forwards each Runner's CONNECT token to the callout inside the
// authorization request: unsealed (no xkey) on a plaintext connection to
// another host, every token crosses the network in clear text.
const plaintextSecret = "n4ts-s3cret-in-url"

// plaintextRefusal is Check's message for a plaintext URL u (shown without
// its user part).
func plaintextRefusal(u string) string {
	return fmt.Sprintf("--nats-url %s is plaintext to a non-loopback host and there is no --xkey-seed-file: every Runner's token would cross the network in clear text (nats-server puts it in each authorization request); use tls:// or wss://, set --xkey-seed-file, or accept that with --allow-plaintext-nats", u)
}

// plaintextConfig is a ServeConfig Check accepts but for NATSURLs, changed by f.
func plaintextConfig(urls string, f func(*callout.ServeConfig)) callout.ServeConfig {
	c := callout.ServeConfig{NATSURLs: urls, Mode: callout.ModeServerConfig, IssuerSeedFile: "i", Account: "RUNNERS", RunnerClusters: "c", NoKick: true}
	if f != nil {
		f(&c)
	}
	return c
}

// Check refuses a plaintext --nats-url to a host that is not loopback unless
// --xkey-seed-file seals the requests or --allow-plaintext-nats accepts the
// risk, naming all three flags and never the URL's credentials.
func TestServeConfigCheckPlaintextNATS(t *testing.T) {
	xkey := func(c *callout.ServeConfig) { c.XKeySeedFile = "x" }
	allow := func(c *callout.ServeConfig) { c.AllowPlaintextNATS = true }
	for _, tc := range []struct {
		name    string
		cfg     callout.ServeConfig
		refused string // the URL the refusal names; "": accepted
	}{
		{"tls", plaintextConfig("tls://nats.example.com:4222", nil), ""},
		{"wss", plaintextConfig("wss://nats.example.com:443", nil), ""},
		{"tls with credentials", plaintextConfig("tls://callout:"+plaintextSecret+"@nats.example.com:4222", nil), ""},
		{"nats to 127.0.0.1 (the default)", plaintextConfig("nats://127.0.0.1:4222", nil), ""},
		{"nats to localhost", plaintextConfig("nats://localhost:4222", nil), ""},
		{"nats to ::1", plaintextConfig("nats://[::1]:4222", nil), ""},
		{"loopback without a scheme", plaintextConfig("127.0.0.1:4222", nil), ""},
		{"several sealed", plaintextConfig("tls://a.example:4222, wss://b.example:443, nats://127.0.0.1:4222", nil), ""},
		{"nats to another host", plaintextConfig("nats://nats.example.com:4222", nil), "nats://nats.example.com:4222"},
		{"ws to another host", plaintextConfig("ws://10.0.0.7:8080", nil), "ws://10.0.0.7:8080"},
		{"another host without a scheme", plaintextConfig("nats.example.com:4222", nil), "nats.example.com:4222"},
		{"one plaintext of several", plaintextConfig("tls://a.example:4222, nats://b.example:4222", nil), "nats://b.example:4222"},
		{"user and password", plaintextConfig("nats://callout:"+plaintextSecret+"@nats.example.com:4222", nil), "nats://nats.example.com:4222"},
		{"token", plaintextConfig("nats://"+plaintextSecret+"@nats.example.com:4222", nil), "nats://nats.example.com:4222"},
		{"credentials without a scheme", plaintextConfig("callout:"+plaintextSecret+"@nats.example.com:4222", nil), "nats://nats.example.com:4222"},
		{"with xkey", plaintextConfig("nats://callout:"+plaintextSecret+"@nats.example.com:4222", xkey), ""},
		{"with the override", plaintextConfig("nats://callout:"+plaintextSecret+"@nats.example.com:4222", allow), ""},
		{"override and xkey", plaintextConfig("ws://10.0.0.7:8080", func(c *callout.ServeConfig) { xkey(c); allow(c) }), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Check()
			if tc.refused == "" {
				if err != nil {
					t.Fatalf("Check: %v, want accepted", err)
				}
				return
			}
			if want := plaintextRefusal(tc.refused); err == nil || err.Error() != want || !errors.Is(err, callout.ErrConfig) {
				t.Fatalf("Check: %v\nwant callout.ErrConfig %q", err, want)
			}
			if strings.Contains(err.Error(), plaintextSecret) || strings.Contains(err.Error(), "@") {
				t.Fatalf("Check's error shows the URL's credentials: %v", err)
			}
		})
	}
}

// With --allow-plaintext-nats Serve starts and says, as a warning before
// anything else, that tokens cross the network in clear text; with xkey or a
// sealed URL it does not.
func TestServePlaintextNATSOverrideWarns(t *testing.T) {
	const warning = "callout: --allow-plaintext-nats: NATS requests are neither TLS nor sealed (no --xkey-seed-file): every Runner's token crosses the network in clear text"
	allow := func(c *callout.ServeConfig) { c.AllowPlaintextNATS = true }
	for _, tc := range []struct {
		name   string
		cfg    callout.ServeConfig
		warned string // the nats_url of the warning; "": none
	}{
		{"override", plaintextConfig("tls://a.example:4222,nats://callout:"+plaintextSecret+"@nats.example.com:4222", allow), "nats://nats.example.com:4222"},
		{"override with xkey", plaintextConfig("nats://nats.example.com:4222", func(c *callout.ServeConfig) { allow(c); c.XKeySeedFile = "x" }), ""},
		{"override with tls", plaintextConfig("tls://nats.example.com:4222", allow), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logs := &testlog.Buffer{}
			cfg := tc.cfg
			cfg.Logger = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
			// A cluster file that is not there ends Serve at its first step
			// after the warning, before it touches the network.
			cfg.RunnerClusters = filepath.Join(t.TempDir(), "missing.yaml")
			if err := callout.Serve(t.Context(), cfg); err == nil || !strings.HasPrefix(err.Error(), "callout: --runner-clusters: ") {
				t.Fatalf("Serve: %v, want it to stop at the missing cluster file", err)
			}
			recs, err := logs.JSONRecords(warning)
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case tc.warned == "" && len(recs) != 0:
				t.Fatalf("warned %v, want no warning", recs)
			case tc.warned != "" && (len(recs) != 1 || recs[0]["level"] != "WARN" || recs[0]["nats_url"] != tc.warned):
				t.Fatalf("warnings %v, want one at WARN with nats_url %s; log:\n%s", recs, tc.warned, logs.String())
			}
			if strings.Contains(logs.String(), plaintextSecret) {
				t.Fatalf("the URL's credentials reached the log:\n%s", logs.String())
			}
		})
	}
}
