package door_test

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/compass-runner/identity/door"
	adminv1 "github.com/compass-runner/identity/gen/compass/admin/v1"
	"github.com/compass-runner/identity/gen/compass/admin/v1/adminv1connect"
	runnerv1 "github.com/compass-runner/identity/gen/compass/runner/v1"
	"github.com/compass-runner/identity/gen/compass/runner/v1/runnerv1connect"
	"github.com/compass-runner/identity/internal/lib/testlog"
	"github.com/compass-runner/identity/internal/lib/testutil"
	"github.com/compass-runner/identity/kubeissuer"
	"github.com/compass-runner/identity/kubeissuer/testkeys"
	"github.com/compass-runner/identity/store"
	"github.com/compass-runner/identity/subjects"
	"github.com/compass-runner/identity/test/natsembed"
	"github.com/compass-runner/identity/verifier"
	"github.com/compass-runner/identity/verifier/verifiertest"
)

// spyStore wraps the real store's minted-token lookup and counts calls, so a
// test can prove a JWS-shaped token never reaches it.
type spyStore struct {
	inner   verifier.TokenStore
	lookups atomic.Int64
}

func (s *spyStore) LookupTokenHash(ctx context.Context, h [sha256.Size]byte) (verifier.MintedToken, error) {
	s.lookups.Add(1)
	return s.inner.LookupTokenHash(ctx, h)
}

// stepClock advances by step on every reading, so durations are exact.
type stepClock struct {
	mu   sync.Mutex
	t    time.Time
	step time.Duration
}

func (c *stepClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(c.step)
	return c.t
}

type harness struct {
	url      string
	dbURL    string
	client   *http.Client
	st       store.Store
	spy      *spyStore
	resolver *verifiertest.CountingResolver
	v        *verifier.RunnerVerifier
	prod     *kubeissuer.Issuer // cluster "prod"
	dark     *kubeissuer.Issuer // cluster "dark": its JWKS always answers 503
	logs     *testlog.Buffer
	reg      *prometheus.Registry
	protos   chan string       // HTTP protocol of each request
	cert     *x509.Certificate // the test server's certificate
}

type harnessOpts struct {
	requester door.Requester
	now       func() time.Time
	extra     func(mux *http.ServeMux, auth connect.Interceptor) // extra test-only handlers
	ready     func(context.Context) error                        // door.Config.Ready
}

func newHarness(t testing.TB, o harnessOpts) *harness {
	t.Helper()
	h := &harness{logs: &testlog.Buffer{}, reg: prometheus.NewRegistry(), protos: make(chan string, 64)}
	dir := t.TempDir()
	var err error
	h.dbURL = "sqlite://" + filepath.Join(dir, "compass.db")
	h.st, err = store.Open(t.Context(), h.dbURL)
	if err != nil {
		t.Fatalf("store.Open: %v", err)
	}
	t.Cleanup(func() { _ = h.st.Close() })
	if h.prod, err = kubeissuer.New(kubeissuer.Options{NewKey: testkeys.Key}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.prod.Close() })
	if h.dark, err = kubeissuer.New(kubeissuer.Options{NewKey: testkeys.Key, Alg: kubeissuer.ES256, Wrap: testutil.NewFailingJWKS(true).Wrap}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.dark.Close() })
	prodCA, err := h.prod.WriteCAFileIn(dir, "prod")
	if err != nil {
		t.Fatal(err)
	}
	darkCA, err := h.dark.WriteCAFileIn(dir, "dark")
	if err != nil {
		t.Fatal(err)
	}
	tenant, err := h.st.BootstrapTenant(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	h.v, err = verifier.New([]verifier.RunnerCluster{
		{Name: "prod", Issuer: h.prod.URL(), CAFile: prodCA},
		{Name: "dark", Issuer: h.dark.URL(), CAFile: darkCA},
	}, verifier.WithTenant(tenant), verifier.WithLogger(log))
	if err != nil {
		t.Fatal(err)
	}
	// Load the keys now: prod's load succeeds, dark's fails (its point).
	_ = h.v.Refresh(t.Context())
	for _, s := range h.v.Status() {
		if s.Usable != (s.Name == "prod") {
			t.Fatalf("cluster %s usable = %v after the first load", s.Name, s.Usable)
		}
	}
	h.spy = &spyStore{inner: h.st}
	h.resolver = &verifiertest.CountingResolver{Inner: verifier.NewResolver(h.v, h.spy)}
	handler, err := door.NewHandler(door.Config{
		Resolver: h.resolver, Enroller: h.st, Runners: h.st, Quarantines: h.st, Requester: o.requester,
		NATSURL: "nats://nats.example:4222", ServerVersion: "test", Logger: log, Metrics: h.reg, Now: o.now,
		Ready: o.ready,
	})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/", handler)
	if o.extra != nil {
		o.extra(mux, door.NewBearerAuth(h.resolver, verifier.SubjectRunner, log, nil))
	}
	srv := testutil.ServeTLS(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case h.protos <- r.Proto:
		default:
		}
		mux.ServeHTTP(w, r)
	}))
	h.url, h.client, h.cert = srv.URL, srv.Client(), srv.Certificate()
	return h
}

func (h *harness) runnerClient() runnerv1connect.RunnerServiceClient {
	return runnerv1connect.NewRunnerServiceClient(h.client, h.url, connect.WithGRPC())
}

func (h *harness) adminClient() adminv1connect.AdminServiceClient {
	return adminv1connect.NewAdminServiceClient(h.client, h.url, connect.WithGRPC())
}

func bearer[T any](msg *T, tok string) *connect.Request[T] {
	r := connect.NewRequest(msg)
	if tok != "" {
		r.Header().Set("Authorization", "Bearer "+tok)
	}
	return r
}

func (h *harness) enroll(t testing.TB, tok, runnerID string) (*runnerv1.EnrollResponse, error) {
	t.Helper()
	res, err := h.runnerClient().Enroll(t.Context(), bearer(&runnerv1.EnrollRequest{RunnerId: runnerID, Version: "v-test", Hostname: "host"}, tok))
	if err != nil {
		return nil, err
	}
	return res.Msg, nil
}

func (h *harness) projected(t testing.TB, is *kubeissuer.Issuer, p kubeissuer.Pod) string {
	t.Helper()
	tok, err := is.Token(p, 0)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func (h *harness) mint(t testing.TB, kind verifier.SubjectKind, id string) string {
	t.Helper()
	tok, _, err := h.st.Mint(t.Context(), kind, id)
	if err != nil {
		t.Fatalf("Mint(%s, %q): %v", kind, id, err)
	}
	return tok
}

// wantCode asserts err is a connect error with the given code and message.
func wantCode(t *testing.T, err error, code connect.Code, msg string) {
	t.Helper()
	if err == nil {
		t.Fatalf("call succeeded, want %s", code)
	}
	if got := connect.CodeOf(err); got != code {
		t.Fatalf("code = %s (%v), want %s", got, err, code)
	}
	var ce *connect.Error
	if msg != "" && errors.As(err, &ce) && ce.Message() != msg {
		t.Fatalf("message = %q, want %q", ce.Message(), msg)
	}
}

// noTokenInLogs asserts no token, nor its signature segment, was logged.
func (h *harness) noTokenInLogs(t *testing.T, toks ...string) {
	t.Helper()
	logs := h.logs.String()
	for _, tok := range toks {
		parts := []string{tok}
		if i := strings.LastIndexByte(tok, '.'); i >= 0 {
			parts = append(parts, tok[i+1:])
		}
		for _, p := range parts {
			if len(p) >= 16 && strings.Contains(logs, p) {
				t.Fatalf("the log contains a presented token (or its signature)")
			}
		}
	}
}

// DL-440 W2: a JWS-shaped token never reaches the hash lookup, and on a door
// that wants an account it gets ErrWrongKind.
func TestJWSShapedTokenNeverReachesHashLookup(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	valid := h.projected(t, h.prod, kubeissuer.Pod{NodeName: "node-a"})
	toks := map[string]string{
		"valid projected":  valid,
		"garbage JWS":      "aaaa.bbbb.cccc",
		"tampered":         valid[:len(valid)-4] + "AAAA",
		"unknown issuer":   h.projected(t, testkeys.Issuer(t), kubeissuer.Pod{NodeName: "node-a"}),
		"dark (no keys)":   h.projected(t, h.dark, kubeissuer.Pod{NodeName: "node-a"}),
		"empty segments":   "..",
		"header only JSON": "eyJhbGciOiJSUzI1NiJ9..",
	}
	for name, tok := range toks {
		t.Run(name, func(t *testing.T) {
			before := h.spy.lookups.Load()
			// The resolver itself: want = account is ErrWrongKind.
			_, err := h.resolver.Resolve(t.Context(), tok, verifier.SubjectAccount)
			if !errors.Is(err, verifier.ErrWrongKind) || !errors.Is(err, verifier.ErrUnauthenticated) {
				t.Fatalf("Resolve(want account) = %v, want ErrWrongKind (and ErrUnauthenticated)", err)
			}
			// Through the admin door.
			_, err = h.adminClient().ListRunners(t.Context(), bearer(&adminv1.ListRunnersRequest{}, tok))
			wantCode(t, err, connect.CodeUnauthenticated, "unauthenticated")
			// And on the Runner door, which sends it to Verify only.
			_, _ = h.enroll(t, tok, "")
			if n := h.spy.lookups.Load() - before; n != 0 {
				t.Fatalf("a JWS-shaped token reached the hash lookup %d times", n)
			}
		})
	}
	h.noTokenInLogs(t, valid)
}

// DL-440 W2: minted Runner tokens still enroll, through the hash lookup.
func TestMintedTokensStillEnroll(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	tok := h.mint(t, verifier.SubjectRunner, "build-01")
	for _, requested := range []string{"", "build-01"} {
		before := h.spy.lookups.Load()
		res, err := h.enroll(t, tok, requested)
		if err != nil {
			t.Fatalf("Enroll(runner_id %q): %v", requested, err)
		}
		if res.GetRunnerId() != "build-01" || res.GetNatsUrl() != "nats://nats.example:4222" || res.GetServerVersion() != "test" {
			t.Fatalf("EnrollResponse = %v", res)
		}
		if n := h.spy.lookups.Load() - before; n != 1 {
			t.Fatalf("hash lookups = %d, want 1", n)
		}
	}
	r, err := h.st.GetRunner(t.Context(), "build-01")
	if err != nil {
		t.Fatal(err)
	}
	if r.Method != store.MethodMinted || r.Cluster != "" || r.NodeName != "" {
		t.Fatalf("registry row = %+v, want a minted Runner with no workload", r)
	}
	// A revoked token no longer enrolls.
	infos, err := h.st.ListTokens(t.Context())
	if err != nil || len(infos) != 1 {
		t.Fatalf("ListTokens = %v, %v", infos, err)
	}
	if _, err := h.st.Revoke(t.Context(), infos[0].ID); err != nil {
		t.Fatal(err)
	}
	_, err = h.enroll(t, tok, "")
	wantCode(t, err, connect.CodeUnauthenticated, "unauthenticated")
	// An account token is the wrong kind for the Runner door.
	_, err = h.enroll(t, h.mint(t, verifier.SubjectAccount, "ops"), "")
	wantCode(t, err, connect.CodeUnauthenticated, "unauthenticated")
	h.noTokenInLogs(t, tok)
}

// DL-440 W2: a projected token on the account (admin) door is Unauthenticated,
// while the same token enrolls on the Runner door.
func TestProjectedTokenOnAdminDoorUnauthenticated(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	tok := h.projected(t, h.prod, kubeissuer.Pod{NodeName: "node-a"})
	if _, err := h.enroll(t, tok, ""); err != nil {
		t.Fatalf("the projected token does not enroll: %v", err)
	}
	_, err := h.adminClient().ListRunners(t.Context(), bearer(&adminv1.ListRunnersRequest{}, tok))
	wantCode(t, err, connect.CodeUnauthenticated, "unauthenticated")
	_, err = h.adminClient().PingRunner(t.Context(), bearer(&adminv1.PingRunnerRequest{RunnerId: "prod/node-a"}, tok))
	wantCode(t, err, connect.CodeUnauthenticated, "unauthenticated")
	// A minted Runner token is refused there too; an account token is accepted.
	_, err = h.adminClient().ListRunners(t.Context(), bearer(&adminv1.ListRunnersRequest{}, h.mint(t, verifier.SubjectRunner, "r1")))
	wantCode(t, err, connect.CodeUnauthenticated, "unauthenticated")
	res, err := h.adminClient().ListRunners(t.Context(), bearer(&adminv1.ListRunnersRequest{}, h.mint(t, verifier.SubjectAccount, "ops")))
	if err != nil {
		t.Fatalf("ListRunners with an account token: %v", err)
	}
	if len(res.Msg.GetRunners()) != 1 || res.Msg.GetRunners()[0].GetId() != "prod/node-a" {
		t.Fatalf("ListRunners = %v", res.Msg)
	}
	h.noTokenInLogs(t, tok)
}

// DL-440 W2: keys-unavailable maps to CodeUnavailable, a bad signature to
// CodeUnauthenticated; the log names the cluster and never the token.
func TestKeysUnavailableAndBadSignatureCodes(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	dark := h.projected(t, h.dark, kubeissuer.Pod{NodeName: "node-a"})
	_, err := h.enroll(t, dark, "")
	wantCode(t, err, connect.CodeUnavailable, "runner cluster keys unavailable; retry later")

	good := h.projected(t, h.prod, kubeissuer.Pod{NodeName: "node-a"})
	// Flip the signature: same header (kid), same claims.
	sig := good[strings.LastIndexByte(good, '.')+1:]
	flipped := []byte(sig)
	if flipped[0] == 'A' {
		flipped[0] = 'B'
	} else {
		flipped[0] = 'A'
	}
	bad := good[:len(good)-len(sig)] + string(flipped)
	if _, err := h.v.Verify(t.Context(), bad); !errors.Is(err, verifier.ErrUnauthenticated) || verifier.ClusterOf(err) != "prod" {
		t.Fatalf("Verify(bad signature) = %v, want ErrUnauthenticated naming prod", err)
	}
	_, err = h.enroll(t, bad, "")
	wantCode(t, err, connect.CodeUnauthenticated, "unauthenticated")
	// A token signed by a key prod never published (same kid) is the same.
	other, err := testkeys.Key(kubeissuer.RS256)
	if err != nil {
		t.Fatal(err)
	}
	other.KeyID = h.prod.SigningKey().KeyID
	forged, err := kubeissuer.SignWith(other, h.prod.Claims(kubeissuer.Pod{NodeName: "node-a"}, 0), nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = h.enroll(t, forged, "")
	wantCode(t, err, connect.CodeUnauthenticated, "unauthenticated")

	logs := h.logs.String()
	if !strings.Contains(logs, "cluster=dark") || !strings.Contains(logs, "cluster=prod") {
		t.Fatalf("the log does not name the clusters:\n%s", logs)
	}
	h.noTokenInLogs(t, dark, good, bad, forged)
	if got := testutil.Counter(t, h.reg, door.MetricAuth, map[string]string{"want": "runner", "code": "unavailable"}); got != 1 {
		t.Fatalf("%s{code=unavailable} = %v, want 1", door.MetricAuth, got)
	}
}

// DL-440 W2: EnrollResponse.runner_id == subj.ID; an empty request runner_id
// is accepted, a matching one too, any other is PermissionDenied.
func TestEnrollRunnerIDIsSubjectID(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	pod := kubeissuer.Pod{NodeName: "ip-10-0-1-5.ec2.internal", NodeUID: "node-uid-1", PodName: "compass-runner-x7", PodUID: "pod-uid-1"}
	tok := h.projected(t, h.prod, pod)
	subj, err := h.v.Verify(t.Context(), tok)
	if err != nil {
		t.Fatal(err)
	}
	if subj.ID != "prod/ip-10-0-1-5_ec2_internal" {
		t.Fatalf("subj.ID = %q", subj.ID)
	}
	res, err := h.enroll(t, tok, "")
	if err != nil {
		t.Fatal(err)
	}
	if res.GetRunnerId() != subj.ID {
		t.Fatalf("EnrollResponse.runner_id = %q, want subj.ID %q", res.GetRunnerId(), subj.ID)
	}
	if res, err = h.enroll(t, tok, subj.ID); err != nil || res.GetRunnerId() != subj.ID {
		t.Fatalf("Enroll(runner_id = subj.ID) = %v, %v", res, err)
	}
	for _, wrong := range []string{"ip-10-0-1-5.ec2.internal", "prod/other", "build-01"} {
		_, err = h.enroll(t, tok, wrong)
		wantCode(t, err, connect.CodePermissionDenied, "")
	}
	_, err = h.enroll(t, tok, strings.Repeat("x", door.MaxClientStringLen+1))
	wantCode(t, err, connect.CodeInvalidArgument, "")
	// What the Runner reports of itself must be printable: operators read it
	// in a terminal. (Invalid UTF-8 cannot be sent at all: protobuf strings
	// refuse it, and the store refuses it too.)
	for _, m := range []*runnerv1.EnrollRequest{{Version: "v1\x1b]0;pwned\x07"}, {Hostname: "host\nforged log line"}} {
		_, err := h.runnerClient().Enroll(t.Context(), bearer(m, tok))
		wantCode(t, err, connect.CodeInvalidArgument, "")
	}
	r, err := h.st.GetRunner(t.Context(), subj.ID)
	if err != nil {
		t.Fatal(err)
	}
	want := store.Runner{ID: subj.ID, Method: store.MethodProjected, Cluster: "prod", NodeName: pod.NodeName,
		NodeUID: pod.NodeUID, PodName: pod.PodName, PodUID: pod.PodUID}
	if r.ID != want.ID || r.Method != want.Method || r.Cluster != want.Cluster || r.NodeName != want.NodeName ||
		r.NodeUID != want.NodeUID || r.PodName != want.PodName || r.PodUID != want.PodUID ||
		r.Version != "v-test" || r.Hostname != "host" {
		t.Fatalf("registry row = %+v, want %+v", r, want)
	}
	if r.FirstEnrolledAt.IsZero() || r.LastEnrolledAt.Before(r.FirstEnrolledAt) {
		t.Fatalf("enrollment times: first %v last %v", r.FirstEnrolledAt, r.LastEnrolledAt)
	}
}

// A node rebuilt under the same name (new node uid, same Runner ID) is logged
// as a warning and counted.
func TestNodeRebuiltWarnsAndCounts(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	for i, uid := range []string{"uid-1", "uid-1", "uid-2", "uid-2"} {
		tok := h.projected(t, h.prod, kubeissuer.Pod{NodeName: "node-a", NodeUID: uid})
		if _, err := h.enroll(t, tok, ""); err != nil {
			t.Fatalf("enroll %d: %v", i, err)
		}
	}
	if got := testutil.Counter(t, h.reg, door.MetricNodeRebuilt, nil); got != 1 {
		t.Fatalf("%s = %v, want 1", door.MetricNodeRebuilt, got)
	}
	logs := h.logs.String()
	if n := strings.Count(logs, "node uid changed"); n != 1 || !strings.Contains(logs, "previous_node_uid=uid-1") {
		t.Fatalf("want one node-rebuilt warning naming uid-1, got %d:\n%s", n, logs)
	}
}

// A call without a usable bearer header is Unauthenticated before any lookup.
func TestMissingOrMalformedBearer(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	tok := h.mint(t, verifier.SubjectRunner, "r1")
	for name, header := range map[string]string{
		"none":         "",
		"basic":        "Basic " + tok,
		"no scheme":    tok,
		"empty bearer": "Bearer ",
	} {
		t.Run(name, func(t *testing.T) {
			before := h.resolver.Calls()
			req := connect.NewRequest(&runnerv1.EnrollRequest{})
			if header != "" {
				req.Header().Set("Authorization", header)
			}
			_, err := h.runnerClient().Enroll(t.Context(), req)
			wantCode(t, err, connect.CodeUnauthenticated, "unauthenticated")
			if n := h.resolver.Calls() - before; n != 0 {
				t.Fatalf("the resolver ran %d times for a header without a bearer token", n)
			}
		})
	}
	// The scheme is case-insensitive.
	req := connect.NewRequest(&runnerv1.EnrollRequest{})
	req.Header().Set("Authorization", "bearer "+tok)
	if _, err := h.runnerClient().Enroll(t.Context(), req); err != nil {
		t.Fatalf("lower-case bearer: %v", err)
	}
	h.noTokenInLogs(t, tok)
}

// The door speaks gRPC over HTTP/2 with TLS.
func TestDoorServesGRPCOverHTTP2(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	if _, err := h.enroll(t, h.mint(t, verifier.SubjectRunner, "r1"), ""); err != nil {
		t.Fatal(err)
	}
	if p := <-h.protos; p != "HTTP/2.0" {
		t.Fatalf("request protocol = %s, want HTTP/2.0", p)
	}
	// Plain HTTP to the TLS port fails.
	plain := strings.Replace(h.url, "https://", "http://", 1)
	c := runnerv1connect.NewRunnerServiceClient(http.DefaultClient, plain, connect.WithGRPC())
	if _, err := c.Enroll(t.Context(), connect.NewRequest(&runnerv1.EnrollRequest{})); err == nil {
		t.Fatal("plaintext call to the door succeeded")
	}
}

// A stream authenticates once, when it opens: an unauthenticated stream never
// reaches its handler; an authenticated one keeps its subject for its life,
// even after its token is revoked (DL-440 §Revocation).
func TestStreamAuthenticatesWhenItOpens(t *testing.T) {
	const procedure = "/compass.test.v1.TestService/Watch"
	var handled atomic.Int64
	release := make(chan struct{})
	var seen sync.Map
	h := newHarness(t, harnessOpts{extra: func(mux *http.ServeMux, auth connect.Interceptor) {
		mux.Handle(procedure, connect.NewServerStreamHandler(procedure,
			func(ctx context.Context, _ *connect.Request[emptypb.Empty], stream *connect.ServerStream[emptypb.Empty]) error {
				handled.Add(1)
				subj, ok := door.SubjectFrom(ctx)
				if !ok {
					return connect.NewError(connect.CodeInternal, errors.New("no subject"))
				}
				seen.Store(subj.ID, true)
				if err := stream.Send(&emptypb.Empty{}); err != nil {
					return err
				}
				select {
				case <-release:
				case <-ctx.Done():
					return ctx.Err()
				}
				for range 2 {
					if err := stream.Send(&emptypb.Empty{}); err != nil {
						return err
					}
				}
				return nil
			}, connect.WithInterceptors(auth)))
	}})
	client := connect.NewClient[emptypb.Empty, emptypb.Empty](h.client, h.url+procedure, connect.WithGRPC())

	// No token: refused when it opens, the handler never runs.
	s, err := client.CallServerStream(t.Context(), connect.NewRequest(&emptypb.Empty{}))
	if err != nil {
		t.Fatal(err)
	}
	if s.Receive() {
		t.Fatal("an unauthenticated stream received a message")
	}
	wantCode(t, s.Err(), connect.CodeUnauthenticated, "unauthenticated")
	_ = s.Close()
	if handled.Load() != 0 {
		t.Fatal("the handler ran for an unauthenticated stream")
	}

	// A minted token: one resolve when it opens, then the stream outlives
	// the token's revocation.
	tok, info, err := h.st.Mint(t.Context(), verifier.SubjectRunner, "streamer")
	if err != nil {
		t.Fatal(err)
	}
	before := h.resolver.Calls()
	s, err = client.CallServerStream(t.Context(), bearer(&emptypb.Empty{}, tok))
	if err != nil {
		t.Fatal(err)
	}
	if !s.Receive() {
		t.Fatalf("first message: %v", s.Err())
	}
	if _, err := h.st.Revoke(t.Context(), info.ID); err != nil {
		t.Fatal(err)
	}
	close(release)
	n := 1
	for s.Receive() {
		n++
	}
	if err := s.Err(); err != nil || n != 3 {
		t.Fatalf("stream got %d messages, err %v; want 3 and nil", n, err)
	}
	_ = s.Close()
	if calls := h.resolver.Calls() - before; calls != 1 {
		t.Fatalf("the stream resolved its token %d times, want once when it opened", calls)
	}
	if _, ok := seen.Load("streamer"); !ok || handled.Load() != 1 {
		t.Fatal("the handler did not see the stream's subject")
	}
	// A new stream with the revoked token is refused.
	s, err = client.CallServerStream(t.Context(), bearer(&emptypb.Empty{}, tok))
	if err != nil {
		t.Fatal(err)
	}
	if s.Receive() {
		t.Fatal("a revoked token opened a stream")
	}
	wantCode(t, s.Err(), connect.CodeUnauthenticated, "unauthenticated")
	_ = s.Close()
}

// PingRunner sends {"command":"ping"} to the Runner's cmd subject over NATS
// and returns the answer and the round-trip time (from the injected clock).
func TestPingRunner(t *testing.T) {
	ns := natsembed.Plain(t)
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	clock := &stepClock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), step: 7 * time.Millisecond}
	h := newHarness(t, harnessOpts{requester: door.NATSRequester{Conn: nc}, now: clock.Now})

	// A stand-in Runner answering on its cmd subject with the Runner's envelope.
	const id = "prod/node-a"
	cmd, err := subjects.Command(id)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan []byte, 1)
	rc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rc.Close)
	sub, err := rc.Subscribe(cmd, func(m *nats.Msg) {
		got <- m.Data
		_ = m.Respond([]byte(`{"ok":true,"result":{"pong":true,"runner_id":"prod/node-a"}}`))
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := rc.Flush(); err != nil {
		t.Fatal(err)
	}
	acct := h.mint(t, verifier.SubjectAccount, "ops")
	res, err := h.adminClient().PingRunner(t.Context(), bearer(&adminv1.PingRunnerRequest{RunnerId: id}, acct))
	if err != nil {
		t.Fatalf("PingRunner: %v", err)
	}
	var req map[string]any
	if err := json.Unmarshal(<-got, &req); err != nil || req["command"] != "ping" || len(req) != 1 {
		t.Fatalf("the Runner received %v (%v), want {\"command\":\"ping\"}", req, err)
	}
	var ans struct {
		OK     bool `json:"ok"`
		Result struct {
			Pong     bool   `json:"pong"`
			RunnerID string `json:"runner_id"`
		} `json:"result"`
	}
	if err := json.Unmarshal([]byte(res.Msg.GetAnswerJson()), &ans); err != nil || !ans.OK || !ans.Result.Pong || ans.Result.RunnerID != id {
		t.Fatalf("answer = %s (%v)", res.Msg.GetAnswerJson(), err)
	}
	if rtt := res.Msg.GetRtt().AsDuration(); rtt != 7*time.Millisecond {
		t.Fatalf("rtt = %v, want 7ms (one clock step)", rtt)
	}

	// Not connected: NotFound. Not a subject token: InvalidArgument.
	if err := sub.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	if err := rc.Flush(); err != nil {
		t.Fatal(err)
	}
	_, err = h.adminClient().PingRunner(t.Context(), bearer(&adminv1.PingRunnerRequest{RunnerId: id}, acct))
	wantCode(t, err, connect.CodeNotFound, `runner "prod/node-a" is not connected to NATS`)
	for _, bad := range []string{"", "a.b", "*", ">"} {
		_, err = h.adminClient().PingRunner(t.Context(), bearer(&adminv1.PingRunnerRequest{RunnerId: bad}, acct))
		wantCode(t, err, connect.CodeInvalidArgument, "")
	}
}

// Without a NATS connection PingRunner is Unavailable.
func TestPingRunnerWithoutNATS(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	_, err := h.adminClient().PingRunner(t.Context(), bearer(&adminv1.PingRunnerRequest{RunnerId: "r1"}, h.mint(t, verifier.SubjectAccount, "ops")))
	wantCode(t, err, connect.CodeUnavailable, "")
}

// BenchmarkEnroll measures one Enroll over gRPC/TLS (HTTP/2, one client
// connection) per token kind: a minted token (one SHA-256 and an indexed
// lookup) and a projected token (an RS256 signature check), each followed by
// the registry write.
func BenchmarkEnroll(b *testing.B) {
	h := newHarness(b, harnessOpts{})
	for _, bc := range []struct {
		name string
		tok  string
	}{
		{"minted", h.mint(b, verifier.SubjectRunner, "bench-01")},
		{"projected", h.projected(b, h.prod, kubeissuer.Pod{NodeName: "bench-node"})},
	} {
		b.Run(bc.name, func(b *testing.B) {
			c := h.runnerClient()
			for b.Loop() {
				req := bearer(&runnerv1.EnrollRequest{}, bc.tok)
				if _, err := c.Enroll(b.Context(), req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
