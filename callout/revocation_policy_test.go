package callout_test

import (
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/compass-runner/identity/callout"
	"github.com/compass-runner/identity/kick"
	"github.com/compass-runner/identity/kubeissuer/testkeys"
	"github.com/compass-runner/identity/store"
	"github.com/compass-runner/identity/store/storetest"
	"github.com/compass-runner/identity/verifier"
	"github.com/compass-runner/identity/verifier/verifiertest"
)

// The revocation policy judges each live connection: by the grant this
// process remembered, else by the Runner ID alone; with the store
// unreadable it still judges projected connections and says so; without a
// cluster file it leaves projected connections to the replicas that have one.
func TestRevocationPolicy(t *testing.T) {
	is := testkeys.Issuer(t)
	c := verifiertest.Cluster(t, is, "prod")
	c.Deny = &verifier.NodeDeny{Nodes: []string{"bad"}}
	v := verifiertest.New(t, "", []verifier.RunnerCluster{c})

	ctx := t.Context()
	url := "sqlite://" + filepath.Join(t.TempDir(), "c.db")
	if _, err := store.Migrate(ctx, url); err != nil {
		t.Fatal(err)
	}
	st, err := store.OpenCurrent(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	_, live, err := st.Mint(ctx, verifier.SubjectRunner, "host-live")
	if err != nil {
		t.Fatal(err)
	}
	_, gone, err := st.Mint(ctx, verifier.SubjectRunner, "host-gone")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Revoke(ctx, gone.ID); err != nil {
		t.Fatal(err)
	}

	conn := func(user string) kick.Conn { return kick.Conn{User: user} }
	check := func(t *testing.T, admit kick.Admit, c kick.Conn, g *kick.Grant, want kick.Reason) {
		t.Helper()
		err := admit(c, g)
		switch {
		case want == "" && err != nil:
			t.Fatalf("%s: refused (%v), want admitted", c.User, err)
		case want != "" && (err == nil || kick.ReasonOf(err) != want):
			t.Fatalf("%s: %v, want refused for %s", c.User, err, want)
		}
	}

	admit, err := callout.RevocationPolicy(v, st, time.Now).Admitter(ctx)
	if err != nil {
		t.Fatal(err)
	}
	check(t, admit, conn("prod/good"), nil, "")
	check(t, admit, conn("prod/bad"), nil, kick.ReasonNodeDenied)
	check(t, admit, conn("gone/node"), nil, kick.ReasonClusterRemoved)
	check(t, admit, conn("host-live"), nil, "")
	check(t, admit, conn("host-gone"), nil, kick.ReasonTokenRevoked)
	check(t, admit, conn("host-live"), &kick.Grant{RunnerID: "host-live", TokenID: live.ID}, "")
	check(t, admit, conn("host-live"), &kick.Grant{RunnerID: "host-live", TokenID: gone.ID}, kick.ReasonTokenRevoked)
	check(t, admit, conn("prod/good"), &kick.Grant{RunnerID: "prod/good", Cluster: "prod", Node: "good", KeyID: is.SigningKey().KeyID}, "")
	check(t, admit, conn("prod/good"), &kick.Grant{RunnerID: "prod/good", Cluster: "prod", Node: "good", KeyID: "pulled"}, kick.ReasonKeyRemoved)

	// The store unreadable: projected connections are still judged, minted
	// ones are left alone, and the error says the sweep must be retried.
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	admit, err = callout.RevocationPolicy(v, st, time.Now).Admitter(ctx)
	if err == nil || admit == nil {
		t.Fatalf("Admitter with the store closed = %v, want an Admit and an error", err)
	}
	check(t, admit, conn("prod/bad"), nil, kick.ReasonNodeDenied)
	check(t, admit, conn("host-gone"), nil, "")

	// No cluster file: projected connections are not this replica's to judge.
	admit, err = callout.RevocationPolicy(nil, nil, nil).Admitter(ctx)
	if err != nil {
		t.Fatal(err)
	}
	check(t, admit, conn("prod/bad"), nil, "")
	check(t, admit, conn("prod/bad"), &kick.Grant{RunnerID: "prod/bad", Cluster: "prod", Node: "bad"}, "")
	if !errors.Is(kick.Refuse(kick.ReasonNodeDenied, verifier.ErrNodeDenied), verifier.ErrNodeDenied) {
		t.Fatal("a Refusal does not unwrap to its cause")
	}
}

// A grant's minted token that expired ends the connection with reason
// token_expired, from the instant of its expiry on, not before; the same
// token revoked is token_revoked.
func TestRevocationPolicyEndsAnExpiredMintedToken(t *testing.T) {
	ctx := t.Context()
	st := storetest.OpenCurrent(t, "sqlite://"+filepath.Join(t.TempDir(), "c.db"))
	_, info, err := st.Mint(ctx, verifier.SubjectRunner, "host-ttl", store.WithTTL(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if info.ExpiresAt.IsZero() {
		t.Fatal("minted with a TTL, the token has no expiry")
	}
	grant := &kick.Grant{RunnerID: "host-ttl", TokenID: info.ID}
	judge := func(at time.Time) error {
		t.Helper()
		admit, err := callout.RevocationPolicy(nil, st, func() time.Time { return at }).Admitter(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return admit(kick.Conn{User: "host-ttl"}, grant)
	}
	if err := judge(info.ExpiresAt.Add(-time.Microsecond)); err != nil {
		t.Fatalf("a microsecond before its expiry: %v, want admitted", err)
	}
	for _, at := range []time.Time{info.ExpiresAt, info.ExpiresAt.Add(time.Hour)} {
		if err := judge(at); kick.ReasonOf(err) != kick.ReasonTokenExpired {
			t.Fatalf("at %s (expiry %s): %v, want refused for %s", at, info.ExpiresAt, err, kick.ReasonTokenExpired)
		}
	}
	if _, err := st.Revoke(ctx, info.ID); err != nil {
		t.Fatal(err)
	}
	if err := judge(info.ExpiresAt.Add(-time.Minute)); kick.ReasonOf(err) != kick.ReasonTokenRevoked {
		t.Fatalf("revoked before its expiry: %v, want refused for %s", err, kick.ReasonTokenRevoked)
	}
}
