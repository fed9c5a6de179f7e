package server_test

import (
	"log/slog"
	"net/url"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	natsserver "github.com/nats-io/nats-server/v2/server"

	runnerv1 "github.com/compass-runner/identity/gen/compass/runner/v1"
	"github.com/compass-runner/identity/gen/compass/runner/v1/runnerv1connect"
	"github.com/compass-runner/identity/internal/lib/testlog"
	"github.com/compass-runner/identity/server"
	"github.com/compass-runner/identity/server/servertest"
	"github.com/compass-runner/identity/test/natsembed"
	"github.com/compass-runner/identity/verifier"
)

// natsWithAuth is a nats-server on loopback that wants a user and password,
// or (user empty) a token.
func natsWithAuth(t *testing.T, user, secret string) *natsserver.Server {
	t.Helper()
	opts := &natsserver.Options{Host: "127.0.0.1", Port: natsserver.RANDOM_PORT, NoLog: true, NoSigs: true}
	if user != "" {
		opts.Username, opts.Password = user, secret
	} else {
		opts.Authorization = secret
	}
	return natsembed.ServeOptions(t, opts)
}

// With credentials in --nats-url (a user and password, or a lone user that
// nats.go sends as a token), serve connects with them, logs the URL only
// redacted, and Enroll tells Runners the URL without them.
func TestServeRedactsNATSURLAndHandsRunnersNoCredentials(t *testing.T) {
	const secret = "n4ts-s3cret-do-not-log"
	for _, tc := range []struct {
		name, user string
		shown      string // the URL's user part as the log shows it
	}{
		{"user and password", "compass-server", "compass-server:xxxxx@"},
		{"token", "", "xxxxx@"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			certFile, keyFile, caFile := servertest.TLS(t, dir)
			ns := natsWithAuth(t, tc.user, secret)
			clean := ns.ClientURL() // nats://127.0.0.1:port
			userinfo := url.User(secret)
			if tc.user != "" {
				userinfo = url.UserPassword(tc.user, secret)
			}
			withCreds := "nats://" + userinfo.String() + "@" + strings.TrimPrefix(clean, "nats://")
			rtok, _, err := servertest.OpenStore(t, dir).Mint(t.Context(), verifier.SubjectRunner, "build-01")
			if err != nil {
				t.Fatal(err)
			}
			logs := &testlog.Buffer{}
			si, done, cancel := servertest.Running(t, server.ServeConfig{
				Listen: "127.0.0.1:0", TLSCert: certFile, TLSKey: keyFile, DataDir: dir,
				NATS:   server.NATSConfig{URL: withCreds},
				Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
			})
			// Logged before Ready; the connect is logged from nats.go's
			// callback goroutine: wait for it, then read the line.
			shown := "nats://" + tc.shown + strings.TrimPrefix(clean, "nats://")
			logs.WaitFor(t, 15*time.Second, `msg="server: NATS connected"`, 1)
			for _, want := range []string{
				`msg="server: door listening (TLS)" addr=` + si.DoorAddr + ` metrics="" nats=` + shown + "\n",
				`msg="server: NATS connected" url=` + shown + " ",
			} {
				if !strings.Contains(logs.String(), want) {
					t.Errorf("the log lacks %q:\n%s", want, logs.String())
				}
			}

			doorURL, hc := servertest.DoorClient(t, si, caFile)
			req := connect.NewRequest(&runnerv1.EnrollRequest{})
			req.Header().Set("Authorization", "Bearer "+rtok)
			res, err := runnerv1connect.NewRunnerServiceClient(hc, doorURL, connect.WithGRPC()).Enroll(t.Context(), req)
			if err != nil {
				t.Fatalf("Enroll: %v", err)
			}
			if got := res.Msg.GetNatsUrl(); got != clean {
				t.Errorf("Enroll's NATS URL = %q, want %q (--nats-url without its user part)", got, clean)
			}
			if u, err := url.Parse(res.Msg.GetNatsUrl()); err != nil || u.User != nil {
				t.Errorf("Enroll's NATS URL %q has a user part (or does not parse: %v)", res.Msg.GetNatsUrl(), err)
			}

			cancel()
			if err := <-done; err != nil {
				t.Fatalf("Serve: %v", err)
			}
			if strings.Contains(logs.String(), secret) {
				t.Fatalf("the NATS secret reached the log:\n%s", logs.String())
			}
		})
	}
}

// A --nats-url that does not parse is refused without showing what it
// holds. (internal/wiring/commands.TestServeCommandRefusesRunnerNATSURLWithCredentials:
// an explicit --runner-nats-url with credentials is refused at start, naming
// the flag and not the credentials.)
func TestServeRefusesNATSURLsThatWouldShowCredentials(t *testing.T) {
	const secret = "n4ts-s3cret-do-not-show"
	dir := t.TempDir()
	certFile, keyFile, _ := servertest.TLS(t, dir)
	err := server.Serve(t.Context(), server.ServeConfig{
		Listen: "127.0.0.1:0", TLSCert: certFile, TLSKey: keyFile, DataDir: dir,
		NATS:          server.NATSConfig{URL: "tls://a.example:4222,nats://compass-server:" + secret + "@127.0.0.1:bad"},
		RunnerNATSURL: "tls://runners.example:4222",
	})
	want := "server: nats connect: --nats-url tls://a.example:4222,(unparsable URL): a URL does not parse"
	if err == nil || err.Error() != want {
		t.Fatalf("Serve: %v\nwant %s", err, want)
	}
}
