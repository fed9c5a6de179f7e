// Package door_test checks that the Server's door and the NATS auth callout
// make the same decision for the same token (DL-440 §Door ordering): each
// side runs its own verifier over the same cluster registrations and the same
// store, as two processes would.
package door_test

import (
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/go-jose/go-jose/v4"
	"github.com/nats-io/nats.go"

	"github.com/compass-runner/identity/callout"
	"github.com/compass-runner/identity/door"
	runnerv1 "github.com/compass-runner/identity/gen/compass/runner/v1"
	"github.com/compass-runner/identity/gen/compass/runner/v1/runnerv1connect"
	"github.com/compass-runner/identity/internal/lib/testutil"
	"github.com/compass-runner/identity/kubeissuer"
	"github.com/compass-runner/identity/store"
	"github.com/compass-runner/identity/store/storetest"
	"github.com/compass-runner/identity/test/natsembed"
	"github.com/compass-runner/identity/verifier"
	"github.com/compass-runner/identity/verifier/verifiertest"
)

// waitFor bounds every wait on the embedded server or the callout.
const waitFor = 10 * time.Second

type stack struct {
	prod, dark, stranger *kubeissuer.Issuer
	doorURL              string
	doorClient           *http.Client
	natsURL              string
	events               chan callout.Event
	st                   store.Store
	dbURL                string
}

// The prod cluster's deny list: one node by name, one node incarnation by UID.
const (
	deniedNode    = "ip-10-0-9-9.ec2.internal"
	deniedNodeUID = "5d0c6a3e-1b7f-4b8e-9c2a-7f3e1d2c4b5a"
)

// newVerifier builds one side's verifier over the shared registrations and
// loads its keys (prod's load succeeds, dark's fails).
func newVerifier(t *testing.T, clusters []verifier.RunnerCluster, tenant string) *verifier.RunnerVerifier {
	t.Helper()
	v, err := verifier.New(clusters, verifier.WithTenant(tenant))
	if err != nil {
		t.Fatal(err)
	}
	_ = v.Refresh(t.Context())
	for _, s := range v.Status() {
		if s.Usable != (s.Name == "prod") {
			t.Fatalf("cluster %s usable = %v", s.Name, s.Usable)
		}
	}
	return v
}

func newStack(t *testing.T) *stack {
	t.Helper()
	s := &stack{events: make(chan callout.Event, 64)}
	dir := t.TempDir()
	s.prod = verifiertest.Issuer(t, kubeissuer.Options{})
	s.dark = verifiertest.Issuer(t, kubeissuer.Options{Alg: kubeissuer.ES256, Wrap: testutil.NewFailingJWKS(true).Wrap})
	s.stranger = verifiertest.Issuer(t, kubeissuer.Options{})
	prod := verifiertest.ClusterIn(t, s.prod, dir, "prod")
	prod.Deny = &verifier.NodeDeny{Nodes: []string{deniedNode}, NodeUIDs: []string{deniedNodeUID}}
	clusters := []verifier.RunnerCluster{prod, verifiertest.ClusterIn(t, s.dark, dir, "dark")}

	// One database, opened by each side as its own process would.
	dbURL := "sqlite://" + filepath.Join(dir, "compass.db")
	s.dbURL = dbURL
	s.st = storetest.Open(t, dbURL)
	calloutStore := storetest.Open(t, dbURL)
	tenant, err := s.st.BootstrapTenant(t.Context())
	if err != nil {
		t.Fatal(err)
	}

	// The door.
	h, err := door.NewHandler(door.Config{
		Resolver: verifier.NewResolver(newVerifier(t, clusters, tenant), s.st),
		Enroller: s.st, Runners: s.st,
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := testutil.ServeTLS(t, h)
	s.doorURL, s.doorClient = srv.URL, srv.Client()

	// nats-server in server-config callout mode with xkey, and the callout.
	nc := natsembed.Start(t, natsembed.Config{
		Resolver: verifier.NewResolver(newVerifier(t, clusters, tenant), calloutStore),
		Observe: func(ev callout.Event) {
			select {
			case s.events <- ev:
			default:
			}
		},
	})
	s.natsURL = nc.URL
	return s
}

// decision is what a side did with a token.
type decision string

const (
	accepted    decision = "accepted"
	refused     decision = "refused"
	unavailable decision = "keys unavailable"
)

// doorDecision calls Enroll with the token.
func (s *stack) doorDecision(t *testing.T, tok string) decision {
	t.Helper()
	req := connect.NewRequest(&runnerv1.EnrollRequest{})
	req.Header().Set("Authorization", "Bearer "+tok)
	_, err := runnerv1connect.NewRunnerServiceClient(s.doorClient, s.doorURL, connect.WithGRPC()).Enroll(t.Context(), req)
	switch code := connect.CodeOf(err); {
	case err == nil:
		return accepted
	case code == connect.CodeUnauthenticated:
		return refused
	case code == connect.CodeUnavailable:
		return unavailable
	default:
		t.Fatalf("door: unexpected %v", err)
	}
	return ""
}

// calloutDecision connects to NATS with the token as auth_token and reads
// the callout's decision and its logged reason; the client's connection must
// agree with the decision.
func (s *stack) calloutDecision(t *testing.T, tok string) (decision, string) {
	t.Helper()
	nc, err := nats.Connect(s.natsURL, nats.Token(tok), nats.NoReconnect(), nats.Timeout(waitFor))
	if err == nil {
		defer nc.Close()
	}
	var ev callout.Event
	select {
	case ev = <-s.events:
	case <-time.After(waitFor):
		t.Fatalf("the callout decided nothing (connect err %v)", err)
	}
	var d decision
	switch ev.Outcome {
	case callout.OutcomeAuthorized:
		d = accepted
	case callout.OutcomeDenied:
		d = refused
	case callout.OutcomeKeysUnavailable:
		d = unavailable
	default:
		t.Fatalf("callout outcome %q (%s)", ev.Outcome, ev.Reason)
	}
	if (err == nil) != (d == accepted) {
		t.Fatalf("callout decided %s but the client's connect returned %v", d, err)
	}
	return d, ev.Reason
}

// The door and the callout accept or refuse each token identically: valid,
// each rejection class, minted, revoked, wrong kind, the leeway's edges, the
// deny list, and a minted Runner ID with "/".
func TestDoorCalloutParity(t *testing.T) {
	s := newStack(t)
	node := kubeissuer.Pod{NodeName: "ip-10-0-1-5.ec2.internal"}
	proj := func(is *kubeissuer.Issuer, edit func(map[string]any)) string {
		t.Helper()
		c := is.Claims(node, 0)
		if edit != nil {
			edit(c)
		}
		tok, err := is.Sign(c)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	k8s := func(c map[string]any) map[string]any { return c["kubernetes.io"].(map[string]any) }
	now := time.Now()
	mint := func(kind verifier.SubjectKind, id string) (string, store.TokenInfo) {
		t.Helper()
		tok, info, err := s.st.Mint(t.Context(), kind, id)
		if err != nil {
			t.Fatal(err)
		}
		return tok, info
	}
	minted, _ := mint(verifier.SubjectRunner, "build-01")
	revoked, rinfo := mint(verifier.SubjectRunner, "build-02")
	if _, err := s.st.Revoke(t.Context(), rinfo.ID); err != nil {
		t.Fatal(err)
	}
	account, _ := mint(verifier.SubjectAccount, "ops")
	// A row minted before "/" was reserved: the callout must not turn it
	// into credentials for a Kubernetes node's subjects, nor the door into
	// that node's identity.
	slashID := storetest.InsertLegacyRunnerToken(t, s.dbURL, "prod/ip-10-0-1-5.ec2.internal", false)
	// expiring sets exp to now+d and keeps the lifetime at 600 s.
	expiring := func(d time.Duration) func(map[string]any) {
		return func(c map[string]any) {
			exp := now.Add(d)
			c["iat"], c["nbf"], c["exp"] = exp.Add(-10*time.Minute).Unix(), exp.Add(-10*time.Minute).Unix(), exp.Unix()
		}
	}
	onNode := func(p kubeissuer.Pod) string {
		t.Helper()
		tok, err := s.prod.Token(p, 0)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	valid := proj(s.prod, nil)
	sig := valid[strings.LastIndexByte(valid, '.')+1:]
	badSig := valid[:len(valid)-len(sig)] + strings.Repeat("A", len(sig))
	otherKey, err := kubeissuer.NewKey(kubeissuer.RS256)
	if err != nil {
		t.Fatal(err)
	}
	otherKey.KeyID = s.prod.SigningKey().KeyID
	forged, err := kubeissuer.SignWith(otherKey, s.prod.Claims(node, 0), nil)
	if err != nil {
		t.Fatal(err)
	}
	noKID := s.prod.SigningKey()
	noKID.KeyID = ""
	withoutKID, err := kubeissuer.SignWith(noKID, s.prod.Claims(node, 0), nil)
	if err != nil {
		t.Fatal(err)
	}
	hs256, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.HS256, Key: []byte(strings.Repeat("k", 32))},
		(&jose.SignerOptions{}).WithHeader("kid", s.prod.SigningKey().KeyID))
	if err != nil {
		t.Fatal(err)
	}
	hsTok := func() string {
		obj, err := hs256.Sign([]byte(fmt.Sprintf(`{"iss":%q,"aud":["compass-runner"],"sub":"system:serviceaccount:compass-runner:compass-runner","exp":%d,"iat":%d}`,
			s.prod.URL(), now.Add(time.Minute).Unix(), now.Unix())))
		if err != nil {
			t.Fatal(err)
		}
		c, err := obj.CompactSerialize()
		if err != nil {
			t.Fatal(err)
		}
		return c
	}()

	cases := []struct {
		name string
		tok  string
		want decision
		why  string // in the callout's logged reason, when set
	}{
		{"valid projected", valid, accepted, ""},
		{"minted runner", minted, accepted, ""},
		{"revoked minted", revoked, refused, ""},
		{"account token (wrong kind)", account, refused, ""},
		{"unknown minted", "bm90LWEtcmVhbC10b2tlbi1idXQtbG9uZy1lbm91Z2gtdG8tbG9vay1saWtlLW9uZQ", refused, ""},
		{"keys unavailable", proj(s.dark, nil), unavailable, ""},
		{"bad signature", badSig, refused, ""},
		{"forged with prod's kid", forged, refused, ""},
		{"unknown issuer", proj(s.stranger, nil), refused, ""},
		{"no kid", withoutKID, refused, ""},
		{"HS256", hsTok, refused, ""},
		{"wrong audience", proj(s.prod, func(c map[string]any) { c["aud"] = []string{"kubernetes"} }), refused, ""},
		{"expired", proj(s.prod, func(c map[string]any) {
			c["iat"], c["nbf"], c["exp"] = now.Add(-20*time.Minute).Unix(), now.Add(-20*time.Minute).Unix(), now.Add(-10*time.Minute).Unix()
		}), refused, ""},
		// One leeway rule at both doors: accepted while now < exp + 60 s.
		{"exp equal to now", proj(s.prod, expiring(0)), accepted, ""},
		{"expired by 1 s (inside the leeway)", proj(s.prod, expiring(-time.Second)), accepted, ""},
		{"expired by 30 s (inside the leeway)", proj(s.prod, expiring(-30*time.Second)), accepted, ""},
		{"expired by the leeway and 1 s", proj(s.prod, expiring(-verifier.Leeway-time.Second)), refused, ""},
		// The leeway's number itself (DL-440: 60 s), pinned with margins for
		// a loaded machine: a longer or shorter leeway fails here.
		{"expired by 50 s (inside a 60 s leeway)", proj(s.prod, expiring(-50*time.Second)), accepted, ""},
		{"expired by 70 s (past a 60 s leeway)", proj(s.prod, expiring(-70*time.Second)), refused, ""},
		{"denied node name", onNode(kubeissuer.Pod{NodeName: deniedNode}), refused, "node " + deniedNode + " is in deny.nodes"},
		{"denied node UID", onNode(kubeissuer.Pod{NodeName: "ip-10-0-7-7.ec2.internal", NodeUID: deniedNodeUID}), refused, "uid " + deniedNodeUID + " is in deny.nodeUIDs"},
		{"other node UID on the same cluster", onNode(kubeissuer.Pod{NodeName: "ip-10-0-7-8.ec2.internal", NodeUID: "0b7a2f4e-3c1d-4e5f-8a9b-1c2d3e4f5a6b"}), accepted, ""},
		{"minted Runner ID with /", slashID, refused, `minted runner ID contains "/", reserved for <cluster>/<node>`},
		{"not yet valid", proj(s.prod, func(c map[string]any) { c["nbf"] = now.Add(10 * time.Minute).Unix() }), refused, ""},
		{"no exp", proj(s.prod, func(c map[string]any) { delete(c, "exp") }), refused, ""},
		{"no iat", proj(s.prod, func(c map[string]any) { delete(c, "iat") }), refused, ""},
		{"lifetime over max", proj(s.prod, func(c map[string]any) { c["exp"] = now.Add(20 * time.Minute).Unix() }), refused, ""},
		{"wrong sub", proj(s.prod, func(c map[string]any) { c["sub"] = "system:serviceaccount:compass-runner:other" }), refused, ""},
		{"wrong namespace", proj(s.prod, func(c map[string]any) { k8s(c)["namespace"] = "default" }), refused, ""},
		{"wrong serviceaccount", proj(s.prod, func(c map[string]any) {
			k8s(c)["serviceaccount"] = map[string]any{"name": "other", "uid": "x"}
		}), refused, ""},
		{"no pod", proj(s.prod, func(c map[string]any) { delete(k8s(c), "pod") }), refused, ""},
		{"no node", proj(s.prod, func(c map[string]any) { delete(k8s(c), "node") }), refused, ""},
		{"JWS-shaped garbage", "aaaa.bbbb.cccc", refused, ""},
		{"malformed", "not a token", refused, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := s.doorDecision(t, tc.tok)
			c, why := s.calloutDecision(t, tc.tok)
			if !strings.Contains(why, tc.why) {
				t.Fatalf("callout reason %q, want it to say %q", why, tc.why)
			}
			if d != c {
				t.Fatalf("door %s, callout %s", d, c)
			}
			if d != tc.want {
				t.Fatalf("both %s, want %s", d, tc.want)
			}
		})
	}
}
