package server_test

import (
	"errors"
	"path/filepath"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/nats-io/nats.go"

	"github.com/compass-runner/identity/callout"
	adminv1 "github.com/compass-runner/identity/gen/compass/admin/v1"
	"github.com/compass-runner/identity/gen/compass/admin/v1/adminv1connect"
	runnerv1 "github.com/compass-runner/identity/gen/compass/runner/v1"
	"github.com/compass-runner/identity/gen/compass/runner/v1/runnerv1connect"
	"github.com/compass-runner/identity/server"
	"github.com/compass-runner/identity/server/servertest"
	"github.com/compass-runner/identity/store"
	"github.com/compass-runner/identity/store/storetest"
	"github.com/compass-runner/identity/test/natsembed"
	"github.com/compass-runner/identity/verifier"
)

// Through the door: a minted Runner token and a minted account token with a
// TTL work until their expiry on the Server's clock and are refused from it
// on, as an unknown token is (Unauthenticated).
func TestMintedTTLThroughTheDoor(t *testing.T) {
	dir := t.TempDir()
	if _, err := store.Migrate(t.Context(), "sqlite://"+filepath.Join(dir, "compass.db")); err != nil {
		t.Fatal(err)
	}
	certFile, keyFile, caFile := servertest.TLS(t, dir)
	clock := storetest.NewClock(time.Now())
	st, err := store.OpenCurrent(t.Context(), "sqlite://"+filepath.Join(dir, "compass.db"), store.WithClock(clock.Now))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	rtok, rinfo, err := st.Mint(t.Context(), verifier.SubjectRunner, "ci-job-1", store.WithTTL(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	atok, _, err := st.Mint(t.Context(), verifier.SubjectAccount, "contractor", store.WithTTL(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	si, done, cancel := servertest.Running(t, server.ServeConfig{Listen: "127.0.0.1:0", TLSCert: certFile, TLSKey: keyFile, DataDir: dir, Now: clock.Now})
	defer servertest.Stop(t, done, cancel)
	doorURL, hc := servertest.DoorClient(t, si, caFile)
	runners := runnerv1connect.NewRunnerServiceClient(hc, doorURL, connect.WithGRPC())
	admin := adminv1connect.NewAdminServiceClient(hc, doorURL, connect.WithGRPC())
	enroll := func(tok string) error {
		req := connect.NewRequest(&runnerv1.EnrollRequest{})
		req.Header().Set("Authorization", "Bearer "+tok)
		_, err := runners.Enroll(t.Context(), req)
		return err
	}
	listRunners := func(tok string) error {
		req := connect.NewRequest(&adminv1.ListRunnersRequest{})
		req.Header().Set("Authorization", "Bearer "+tok)
		_, err := admin.ListRunners(t.Context(), req)
		return err
	}
	unknown, err := verifier.GenerateToken()
	if err != nil {
		t.Fatal(err)
	}
	calls := []struct {
		name string
		call func(string) error
		tok  string
	}{{"Enroll", enroll, rtok}, {"ListRunners", listRunners, atok}}

	clock.Advance(rinfo.ExpiresAt.Sub(clock.Now()) - time.Millisecond)
	for _, c := range calls {
		if err := c.call(c.tok); err != nil {
			t.Fatalf("%s a millisecond before the expiry: %v", c.name, err)
		}
	}
	clock.Advance(time.Millisecond)
	for _, c := range calls {
		var got, unk *connect.Error
		if err := c.call(c.tok); !errors.As(err, &got) || got.Code() != connect.CodeUnauthenticated {
			t.Fatalf("%s at the expiry: %v, want Unauthenticated", c.name, err)
		}
		// The same answer as an unknown token's.
		if !errors.As(c.call(unknown), &unk) || got.Code() != unk.Code() || got.Message() != unk.Message() {
			t.Fatalf("%s at the expiry answers %v; an unknown token gets %v", c.name, got, unk)
		}
	}
}

// Through the callout: the user JWT issued for a minted token with a TTL
// shorter than the callout's cap expires at the token's expiry (in whole
// seconds); with a longer TTL the cap applies; and once the token has
// expired on the resolver's clock, NATS refuses the CONNECT with the cause
// "token expired".
func TestMintedTTLCapsTheUserJWT(t *testing.T) {
	dir := t.TempDir()
	st, err := store.Open(t.Context(), "sqlite://"+filepath.Join(dir, "compass.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	short, sinfo, err := st.Mint(t.Context(), verifier.SubjectRunner, "ci-job-1", store.WithTTL(90*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	long, linfo, err := st.Mint(t.Context(), verifier.SubjectRunner, "ci-job-2", store.WithTTL(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	// The resolver's clock, moved past the expiry below; the callout's own
	// clock is the wall clock, which the token's 90 s outlast.
	clock := storetest.NewClock(time.Now())
	events := make(chan callout.Event, 8)
	co := natsembed.Start(t, natsembed.Config{
		Resolver: verifier.NewResolver(nil, st, verifier.WithResolverClock(clock.Now)),
		Observe:  func(e callout.Event) { events <- e },
	})
	connect := func(tok string) (callout.Event, error) {
		t.Helper()
		nc, err := nats.Connect(co.URL, nats.Token(tok), nats.NoReconnect(), nats.Timeout(10*time.Second))
		if nc != nil {
			nc.Close()
		}
		select {
		case ev := <-events:
			return ev, err
		case <-time.After(10 * time.Second):
			t.Fatal("no callout decision")
		}
		return callout.Event{}, err
	}

	ev, err := connect(short)
	if err != nil || ev.Outcome != callout.OutcomeAuthorized || ev.RunnerID != "ci-job-1" {
		t.Fatalf("connect with the 90 s token: %v, decision %+v", err, ev)
	}
	if want := time.Unix(sinfo.ExpiresAt.Unix(), 0); !ev.UserJWTExpiry.Equal(want) {
		t.Fatalf("user JWT expires at %v, want the token's expiry %v", ev.UserJWTExpiry, want)
	}
	ev, err = connect(long)
	if err != nil || ev.Outcome != callout.OutcomeAuthorized {
		t.Fatalf("connect with the 1 h token: %v, decision %+v", err, ev)
	}
	if !ev.UserJWTExpiry.Before(linfo.ExpiresAt.Add(-45*time.Minute)) || time.Until(ev.UserJWTExpiry) > callout.DefaultMaxLifetime {
		t.Fatalf("user JWT of the 1 h token expires at %v: want the %s cap, not the token's expiry %v", ev.UserJWTExpiry, callout.DefaultMaxLifetime, linfo.ExpiresAt)
	}

	clock.Advance(sinfo.ExpiresAt.Sub(clock.Now()))
	ev, err = connect(short)
	if !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("connect with the expired token: %v, want an authorization error", err)
	}
	if ev.Outcome != callout.OutcomeDenied || ev.Reason != "verifier: token not found: token expired" {
		t.Fatalf("decision on the expired token %+v, want denied with the cause token expired", ev)
	}
}
