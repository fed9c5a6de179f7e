package server_test

import (
	"errors"
	"path/filepath"
	"strings"
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
	"github.com/compass-runner/identity/store"
	"github.com/compass-runner/identity/store/storetest"
	"github.com/compass-runner/identity/test/natsembed"
	"github.com/compass-runner/identity/verifier"
)

// --ttl stores the expiry (CreatedAt plus the TTL), the mint commands say
// it, list-tokens shows it, and COMPASS_TTL stands in for the flag.
func TestMintTTLFlag(t *testing.T) {
	dir := migrated(t)
	code, _, stderr := run(t, nil, "mint-runner-token", "--runner-id", "ci-job-1", "--ttl", "2h", "--data-dir", dir)
	if code != 0 {
		t.Fatalf("mint-runner-token --ttl 2h: code %d, stderr %q", code, stderr)
	}
	code, _, stderr2 := run(t, map[string]string{"COMPASS_TTL": "30m"}, "mint-account-token", "--name", "contractor", "--data-dir", dir)
	if code != 0 {
		t.Fatalf("mint-account-token with COMPASS_TTL: %s", stderr2)
	}
	code, _, stderr3 := run(t, nil, "mint-runner-token", "--runner-id", "build-01", "--data-dir", dir)
	if code != 0 {
		t.Fatal(stderr3)
	}
	infos, err := openStore(t, dir).ListTokens(t.Context())
	if err != nil || len(infos) != 3 {
		t.Fatalf("tokens: %v, %v", infos, err)
	}
	byID := map[string]store.TokenInfo{}
	for _, i := range infos {
		byID[i.SubjectID] = i
	}
	for id, ttl := range map[string]time.Duration{"ci-job-1": 2 * time.Hour, "contractor": 30 * time.Minute} {
		i := byID[id]
		if got := i.ExpiresAt.Sub(i.CreatedAt); got != ttl {
			t.Fatalf("%s expires %s after it was minted, want %s", id, got, ttl)
		}
	}
	if !byID["build-01"].ExpiresAt.IsZero() {
		t.Fatalf("a token minted without --ttl expires at %v", byID["build-01"].ExpiresAt)
	}
	ci := byID["ci-job-1"]
	wantErr := `minted runner token ` + ci.ID + ` for "ci-job-1"; it expires at ` + ci.ExpiresAt.Format(time.RFC3339) +
		"; it is shown once and cannot be shown again (revoke with: compass-server revoke-token " + ci.ID + ")\n"
	if stderr != wantErr {
		t.Fatalf("mint-runner-token --ttl stderr %q, want %q", stderr, wantErr)
	}
	if !strings.Contains(stderr3, "; it does not expire;") {
		t.Fatalf("mint-runner-token without --ttl stderr %q", stderr3)
	}
	_, list, _ := run(t, nil, "list-tokens", "--data-dir", dir)
	lines := strings.Split(strings.TrimSpace(list), "\n")
	if len(lines) != 4 || strings.Join(strings.Fields(lines[0]), " ") != "ID KIND SUBJECT CREATED EXPIRES REVOKED" {
		t.Fatalf("list-tokens:\n%s", list)
	}
	for _, line := range lines[1:] {
		f := strings.Fields(line)
		i := byID[f[2]]
		wantExp := "-"
		if !i.ExpiresAt.IsZero() {
			wantExp = i.ExpiresAt.Format(time.RFC3339)
		}
		if len(f) != 6 || f[0] != i.ID || f[4] != wantExp || f[5] != "-" {
			t.Fatalf("list-tokens row %q, want ID %s and EXPIRES %s", line, i.ID, wantExp)
		}
	}
}

// A bad --ttl is a usage error naming the flag and the bound, and stores
// nothing.
func TestMintTTLRefused(t *testing.T) {
	dir := migrated(t)
	for _, tc := range []struct {
		ttl, want string
	}{
		{"0s", "compass-server: --ttl 0s: must be positive (leave --ttl out for a token that does not expire)\n"},
		{"-1h", "compass-server: --ttl -1h0m0s: must be positive (leave --ttl out for a token that does not expire)\n"},
		{"500ms", "compass-server: --ttl 500ms: under the minimum of 1s (the NATS user JWT a token is granted expires in whole seconds)\n"},
		{"8785h", "compass-server: --ttl 8785h0m0s: over the maximum of 8784h0m0s (366 days; longer is no safer than no expiry and more likely a mistyped unit: leave --ttl out and revoke the token instead)\n"},
		{"7d", `compass-server: invalid value "7d" for flag -ttl: parse error (see compass-server mint-runner-token --help)` + "\n"},
	} {
		code, stdout, stderr := run(t, nil, "mint-runner-token", "--runner-id", "r1", "--ttl", tc.ttl, "--data-dir", dir)
		if code != 2 || stdout != "" || stderr != tc.want {
			t.Fatalf("--ttl %s: code %d, stdout %q, stderr %q; want %q", tc.ttl, code, stdout, stderr, tc.want)
		}
	}
	if infos, err := openStore(t, dir).ListTokens(t.Context()); err != nil || len(infos) != 0 {
		t.Fatalf("refused --ttl stored %v (%v)", infos, err)
	}
	// The bounds themselves are accepted.
	for _, ttl := range []string{"1s", "8784h"} {
		if code, _, stderr := run(t, nil, "mint-runner-token", "--runner-id", "r1", "--ttl", ttl, "--data-dir", dir); code != 0 {
			t.Fatalf("--ttl %s: %s", ttl, stderr)
		}
	}
}

// The mint commands' help says what --ttl does and what a second mint for
// the same ID does (testSecondMint in storetest checks that it is so).
func TestMintHelpSaysTTLAndSecondMint(t *testing.T) {
	for _, cmd := range []string{"mint-runner-token", "mint-account-token"} {
		_, stdout, _ := run(t, nil, cmd, "--help")
		for _, want := range []string{
			"--ttl duration  (env COMPASS_TTL)",
			"the token expires this long after it is minted (a Go duration: 8h, 720h; 1s to 8784h0m0s); without it the token never expires",
			"a NATS\nconnection made with it is granted a user JWT that ends no later than the\nexpiry.",
			"Minting again for an ID that already has a token does not replace it: the new\ntoken is added beside the old one, under its own public ID, and both stay valid\nuntil each is revoked or expires.",
		} {
			if !strings.Contains(stdout, want) {
				t.Fatalf("%s --help lacks %q:\n%s", cmd, want, stdout)
			}
		}
	}
}

// Through the door: a minted Runner token and a minted account token with a
// TTL work until their expiry on the Server's clock and are refused from it
// on, as an unknown token is (Unauthenticated).
func TestMintedTTLThroughTheDoor(t *testing.T) {
	dir := migrated(t)
	certFile, keyFile, caFile := devTLS(t, dir)
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
	si, done, cancel := serveUntilReady(t, server.ServeConfig{Listen: "127.0.0.1:0", TLSCert: certFile, TLSKey: keyFile, DataDir: dir, Now: clock.Now})
	if si.DoorAddr == "" {
		t.Fatalf("Serve: %v", <-done)
	}
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	doorURL := "https://" + si.DoorAddr
	hc, err := server.DoorClient(doorURL, caFile)
	if err != nil {
		t.Fatal(err)
	}
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
