// Package storetest is the conformance suite every store backend passes. A
// backend's tests call Run with a Backend that makes fresh databases.
package storetest

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/compass-runner/identity/store"
	"github.com/compass-runner/identity/verifier"
)

// Backend is what the suite needs from one backend.
type Backend struct {
	// Name is "sqlite" or "postgres": what store.Store.Backend reports.
	Name string
	// NewURL returns a store.Open URL naming a new, empty database (or schema)
	// of its own, removed when t ends.
	NewURL func(t *testing.T) string
	// Exec runs one SQL statement without parameters against the database at
	// url, outside the store: the test-only path for rows the API refuses.
	Exec func(t *testing.T, url, query string)
	// QueryInt runs a query returning one integer against the database at url.
	QueryInt func(t *testing.T, url, query string) int64
	// InsertToken writes a token row straight into the database at url,
	// stamped with the bootstrap tenant, bypassing every check of the API (a
	// row minted before "/" was reserved for workload Runner IDs).
	InsertToken func(t *testing.T, url string, row TokenRow)
}

// TokenRow is a raw token row for Backend.InsertToken.
type TokenRow struct {
	PublicID  string
	Hash      [sha256.Size]byte
	Kind      verifier.SubjectKind
	SubjectID string
	CreatedAt time.Time
	RevokedAt time.Time // zero: not revoked
	ExpiresAt time.Time // zero: never expires
}

// Clock is a settable clock for store.WithClock. Its zero value is not
// usable; use NewClock.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a clock stopped at start.
func NewClock(start time.Time) *Clock { return &Clock{now: start} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// start is the suite's clock start: nanoseconds and a non-UTC zone, so the
// suite sees that stored times come back in UTC at microsecond resolution.
var start = time.Date(2026, 3, 14, 15, 9, 26, 535897932, time.FixedZone("UTC+2", 2*3600))

// stored is how a store gives a time back.
func stored(t time.Time) time.Time { return t.UTC().Truncate(time.Microsecond) }

// Run runs the conformance suite against b.
func Run(t *testing.T, b Backend) {
	t.Helper()
	for _, tc := range []struct {
		name string
		fn   func(*testing.T, Backend)
	}{
		{"MintThenLookup", testMintThenLookup},
		{"LookupUnknown", testLookupUnknown},
		{"Revoke", testRevoke},
		{"WrongKind", testWrongKind},
		{"MintRejects", testMintRejects},
		{"StoreTokenHash", testStoreTokenHash},
		{"CountRunnerTokenIDsWithSlash", testCountSlash},
		{"BootstrapTenant", testBootstrapTenant},
		{"ListNeverExposesHashes", testListNoHashes},
		{"Enrollment", testEnrollment},
		{"EnrollmentRejects", testEnrollmentRejects},
		{"TouchRunner", testTouchRunner},
		{"MintWithTTL", testMintWithTTL},
		{"TTLRejects", testTTLRejects},
		{"SecondMintForSameID", testSecondMint},
		{"MigrationsIdempotentOnReopen", testReopen},
		{"SchemaTooNew", testSchemaTooNew},
		{"MigrateThenOpenCurrent", testMigrateThenOpenCurrent},
		{"OpenCurrentRefusesOtherVersions", testOpenCurrentRefuses},
		{"ConcurrentOpen", testConcurrentOpen},
		{"ConcurrentUse", testConcurrentUse},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, b) })
	}
}

// open opens a store on url with clock and closes it when t ends.
func open(t *testing.T, url string, clock *Clock) store.Store {
	t.Helper()
	st, err := store.Open(t.Context(), url, store.WithClock(clock.Now))
	if err != nil {
		t.Fatalf("store.Open: %v", err)
	}
	t.Cleanup(func() {
		if err := st.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return st
}

// fresh opens a store on a new database.
func fresh(t *testing.T, b Backend) (store.Store, *Clock, string) {
	t.Helper()
	url := b.NewURL(t)
	clock := NewClock(start)
	st := open(t, url, clock)
	if got := st.Backend(); got != b.Name {
		t.Fatalf("Backend() = %q, want %q", got, b.Name)
	}
	return st, clock, url
}

func mustMint(t *testing.T, st store.Store, kind verifier.SubjectKind, id string) (string, store.TokenInfo) {
	t.Helper()
	tok, info, err := st.Mint(t.Context(), kind, id)
	if err != nil {
		t.Fatalf("Mint(%s, %q): %v", kind, id, err)
	}
	return tok, info
}

func bootstrap(t *testing.T, st store.Store) string {
	t.Helper()
	id, err := st.BootstrapTenant(t.Context())
	if err != nil {
		t.Fatalf("BootstrapTenant: %v", err)
	}
	if id == "" {
		t.Fatal("BootstrapTenant returned an empty ID")
	}
	return id
}

var publicIDRE = regexp.MustCompile(`^[0-9a-f]{16}$`)

func testMintThenLookup(t *testing.T, b Backend) {
	st, clock, _ := fresh(t, b)
	ctx := t.Context()
	tenant := bootstrap(t, st)
	res := verifier.NewResolver(nil, st)
	for _, tc := range []struct {
		kind verifier.SubjectKind
		id   string
	}{
		{verifier.SubjectRunner, "runner-1"},
		{verifier.SubjectAccount, "ops"},
		{verifier.SubjectAccount, "team/alice"}, // "/" is reserved for Runner IDs only
	} {
		t.Run(tc.kind.String()+"/"+tc.id, func(t *testing.T) {
			clock.Advance(time.Second)
			tok, info, err := st.Mint(ctx, tc.kind, tc.id)
			if err != nil {
				t.Fatalf("Mint: %v", err)
			}
			if err := verifier.CheckMintedToken(tok); err != nil {
				t.Fatalf("minted token fails CheckMintedToken: %v", err)
			}
			want := store.TokenInfo{ID: info.ID, Kind: tc.kind, SubjectID: tc.id, Tenant: tenant, CreatedAt: stored(clock.Now())}
			if info != want {
				t.Fatalf("Mint info = %+v, want %+v", info, want)
			}
			if !publicIDRE.MatchString(info.ID) {
				t.Fatalf("public ID %q is not 16 lowercase hex digits", info.ID)
			}
			m, err := st.LookupTokenHash(ctx, verifier.HashToken(tok))
			if err != nil {
				t.Fatalf("LookupTokenHash: %v", err)
			}
			if wantM := (verifier.MintedToken{Kind: tc.kind, ID: tc.id, Tenant: tenant, TokenID: info.ID}); m != wantM {
				t.Fatalf("LookupTokenHash = %+v, want %+v", m, wantM)
			}
			subj, err := res.Resolve(ctx, tok, tc.kind)
			if err != nil {
				t.Fatalf("Resolve: %v", err)
			}
			if subj.Kind != tc.kind || subj.ID != tc.id || subj.Tenant != tenant || !subj.Expiry.IsZero() || subj.Workload != nil || subj.TokenID != info.ID {
				t.Fatalf("Resolve = %+v, want kind %s, ID %q, tenant %q, token ID %s, no expiry or workload", subj, tc.kind, tc.id, tenant, info.ID)
			}
		})
	}
}

func testLookupUnknown(t *testing.T, b Backend) {
	st, _, _ := fresh(t, b)
	tok, err := verifier.GenerateToken()
	if err != nil {
		t.Fatal(err)
	}
	_, err = st.LookupTokenHash(t.Context(), verifier.HashToken(tok))
	if !errors.Is(err, verifier.ErrTokenNotFound) {
		t.Fatalf("LookupTokenHash(unknown) error = %v, want ErrTokenNotFound", err)
	}
	_, err = verifier.NewResolver(nil, st).Resolve(t.Context(), tok, verifier.SubjectRunner)
	if !errors.Is(err, verifier.ErrTokenNotFound) || !errors.Is(err, verifier.ErrUnauthenticated) {
		t.Fatalf("Resolve(unknown) error = %v, want ErrTokenNotFound and ErrUnauthenticated", err)
	}
}

func testRevoke(t *testing.T, b Backend) {
	st, clock, _ := fresh(t, b)
	ctx := t.Context()
	res := verifier.NewResolver(nil, st)
	tok, info := mustMint(t, st, verifier.SubjectRunner, "r1")
	other, _ := mustMint(t, st, verifier.SubjectRunner, "r2")

	clock.Advance(time.Minute)
	revokedAt := stored(clock.Now())
	got, err := st.Revoke(ctx, info.ID)
	if err != nil {
		t.Fatalf("Revoke: %v", err)
	}
	want := info
	want.RevokedAt = revokedAt
	if got != want || !got.Revoked() {
		t.Fatalf("Revoke = %+v, want %+v", got, want)
	}
	m, err := st.LookupTokenHash(ctx, verifier.HashToken(tok))
	if err != nil {
		t.Fatalf("LookupTokenHash(revoked): %v", err)
	}
	if !m.Revoked || m.ID != "r1" {
		t.Fatalf("LookupTokenHash(revoked) = %+v, want Revoked for r1", m)
	}
	if _, err := res.Resolve(ctx, tok, verifier.SubjectRunner); !errors.Is(err, verifier.ErrTokenNotFound) || !errors.Is(err, verifier.ErrUnauthenticated) {
		t.Fatalf("Resolve(revoked) error = %v, want ErrTokenNotFound and ErrUnauthenticated", err)
	}
	if _, err := res.Resolve(ctx, other, verifier.SubjectRunner); err != nil {
		t.Fatalf("Resolve(other token) after revoking r1: %v", err)
	}

	// A second revocation keeps the first time.
	clock.Advance(time.Hour)
	again, err := st.Revoke(ctx, info.ID)
	if err != nil {
		t.Fatalf("Revoke again: %v", err)
	}
	if !again.RevokedAt.Equal(revokedAt) {
		t.Fatalf("second Revoke moved revoked_at from %v to %v", revokedAt, again.RevokedAt)
	}

	if _, err := st.Revoke(ctx, "0123456789abcdef"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Revoke(unknown) error = %v, want ErrNotFound", err)
	}
}

func testWrongKind(t *testing.T, b Backend) {
	st, _, _ := fresh(t, b)
	res := verifier.NewResolver(nil, st)
	runnerTok, _ := mustMint(t, st, verifier.SubjectRunner, "r1")
	accountTok, _ := mustMint(t, st, verifier.SubjectAccount, "ops")
	for _, tc := range []struct {
		name  string
		token string
		want  verifier.SubjectKind
	}{
		{"runner token on account door", runnerTok, verifier.SubjectAccount},
		{"account token on runner door", accountTok, verifier.SubjectRunner},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := res.Resolve(t.Context(), tc.token, tc.want)
			if !errors.Is(err, verifier.ErrWrongKind) || !errors.Is(err, verifier.ErrUnauthenticated) {
				t.Fatalf("Resolve error = %v, want ErrWrongKind and ErrUnauthenticated", err)
			}
		})
	}
}

func testMintRejects(t *testing.T, b Backend) {
	st, _, _ := fresh(t, b)
	for _, tc := range []struct {
		name string
		kind verifier.SubjectKind
		id   string
	}{
		{"runner ID with slash", verifier.SubjectRunner, "a/b"},
		{"workload-shaped runner ID", verifier.SubjectRunner, verifier.WorkloadRunnerID("prod", "ip-10-0-1-5.ec2.internal")},
		{"empty runner ID", verifier.SubjectRunner, ""},
		{"runner ID with dot", verifier.SubjectRunner, "a.b"},
		{"runner ID with wildcard", verifier.SubjectRunner, "a*"},
		{"runner ID with space", verifier.SubjectRunner, "a b"},
		{"runner ID too long", verifier.SubjectRunner, strings.Repeat("r", verifier.MaxSubjectIDLen+1)},
		{"account name with dot", verifier.SubjectAccount, "ops.team"},
		{"unknown kind", verifier.SubjectKind(0), "x"},
		{"kind 3", verifier.SubjectKind(3), "x"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tok, _, err := st.Mint(t.Context(), tc.kind, tc.id)
			if !errors.Is(err, verifier.ErrInvalidArgument) {
				t.Fatalf("Mint(%s, %q) error = %v, want ErrInvalidArgument", tc.kind, tc.id, err)
			}
			if tok != "" {
				t.Fatal("Mint returned a token with an error")
			}
			if !strings.HasPrefix(err.Error(), "store: ") {
				t.Fatalf("error %q is not prefixed with the package name", err)
			}
		})
	}
	toks, err := st.ListTokens(t.Context())
	if err != nil {
		t.Fatalf("ListTokens: %v", err)
	}
	if len(toks) != 0 {
		t.Fatalf("refused mints stored %d tokens", len(toks))
	}
}

func testStoreTokenHash(t *testing.T, b Backend) {
	st, _, _ := fresh(t, b)
	ctx := t.Context()
	good, err := verifier.GenerateToken()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		token string
		kind  verifier.SubjectKind
		id    string
	}{
		{"token with dot", good[:20] + "." + good[20:], verifier.SubjectRunner, "r1"},
		{"JWS-shaped token", good[:10] + "." + good[10:30] + "." + good[30:], verifier.SubjectRunner, "r1"},
		{"empty token", "", verifier.SubjectRunner, "r1"},
		{"short token", good[:store.MinStoredTokenBytes-1], verifier.SubjectRunner, "r1"},
		{"runner ID with slash", good, verifier.SubjectRunner, "a/b"},
		{"unknown kind", good, verifier.SubjectKind(0), "r1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := st.StoreTokenHash(ctx, tc.token, tc.kind, tc.id)
			if !errors.Is(err, verifier.ErrInvalidArgument) {
				t.Fatalf("StoreTokenHash error = %v, want ErrInvalidArgument", err)
			}
			if tc.token != "" && strings.Contains(err.Error(), tc.token) {
				t.Fatal("StoreTokenHash error quotes the token")
			}
		})
	}
	if toks, err := st.ListTokens(ctx); err != nil || len(toks) != 0 {
		t.Fatalf("after refused stores ListTokens = %d tokens, %v; want none", len(toks), err)
	}

	info, err := st.StoreTokenHash(ctx, good, verifier.SubjectRunner, "r1")
	if err != nil {
		t.Fatalf("StoreTokenHash(good): %v", err)
	}
	subj, err := verifier.NewResolver(nil, st).Resolve(ctx, good, verifier.SubjectRunner)
	if err != nil || subj.ID != "r1" || subj.Tenant != info.Tenant {
		t.Fatalf("Resolve(stored token) = %+v, %v; want r1 in tenant %q", subj, err, info.Tenant)
	}
	_, err = st.StoreTokenHash(ctx, good, verifier.SubjectAccount, "ops")
	if !errors.Is(err, store.ErrConflict) {
		t.Fatalf("StoreTokenHash(same token twice) error = %v, want ErrConflict", err)
	}
	if strings.Contains(err.Error(), good) {
		t.Fatal("conflict error quotes the token")
	}
}

func testCountSlash(t *testing.T, b Backend) {
	st, clock, url := fresh(t, b)
	ctx := t.Context()
	count := func(want int64) {
		t.Helper()
		n, err := st.CountRunnerTokenIDsWithSlash(ctx)
		if err != nil {
			t.Fatalf("CountRunnerTokenIDsWithSlash: %v", err)
		}
		if n != want {
			t.Fatalf("CountRunnerTokenIDsWithSlash = %d, want %d", n, want)
		}
	}
	count(0)
	mustMint(t, st, verifier.SubjectRunner, "plain")
	mustMint(t, st, verifier.SubjectAccount, "team/x")
	count(0)

	row := func(pub string, kind verifier.SubjectKind, id string, revoked bool) TokenRow {
		tok, err := verifier.GenerateToken()
		if err != nil {
			t.Fatal(err)
		}
		r := TokenRow{PublicID: pub, Hash: verifier.HashToken(tok), Kind: kind, SubjectID: id, CreatedAt: clock.Now()}
		if revoked {
			r.RevokedAt = clock.Now()
		}
		return r
	}
	b.InsertToken(t, url, row("00000000000000a1", verifier.SubjectRunner, "legacy/a", false))
	b.InsertToken(t, url, row("00000000000000a2", verifier.SubjectRunner, "legacy/b", true))
	b.InsertToken(t, url, row("00000000000000a3", verifier.SubjectAccount, "legacy/c", false))
	b.InsertToken(t, url, row("00000000000000a4", verifier.SubjectRunner, "legacy-d", false))
	b.InsertToken(t, url, row("00000000000000a5", verifier.SubjectRunner, "x/y/z", false))
	count(2)

	if _, err := st.Revoke(ctx, "00000000000000a1"); err != nil {
		t.Fatalf("Revoke legacy row: %v", err)
	}
	count(1)
	if _, err := st.Revoke(ctx, "00000000000000a5"); err != nil {
		t.Fatalf("Revoke legacy row: %v", err)
	}
	count(0)

	// A row with an expiry counts until it expires at the store's clock,
	// the instant Resolve starts refusing it.
	expiring := row("00000000000000a6", verifier.SubjectRunner, "legacy/e", false)
	expiring.ExpiresAt = clock.Now().Add(time.Hour)
	b.InsertToken(t, url, expiring)
	count(1)
	clock.Advance(time.Hour - time.Microsecond)
	count(1)
	clock.Advance(time.Microsecond)
	count(0)
}

func testBootstrapTenant(t *testing.T, b Backend) {
	st, _, url := fresh(t, b)
	ctx := t.Context()
	tenant := bootstrap(t, st)
	if n := b.QueryInt(t, url, "SELECT count(*) FROM tenants"); n != 1 {
		t.Fatalf("tenants has %d rows after the first migration, want 1", n)
	}
	mustMint(t, st, verifier.SubjectRunner, "r1")
	mustMint(t, st, verifier.SubjectAccount, "ops")
	toks, err := st.ListTokens(ctx)
	if err != nil {
		t.Fatalf("ListTokens: %v", err)
	}
	for _, tk := range toks {
		if tk.Tenant != tenant {
			t.Fatalf("token %s has tenant %q, want the bootstrap tenant %q", tk.ID, tk.Tenant, tenant)
		}
	}
	if _, err := st.RecordEnrollment(ctx, store.Enrollment{RunnerID: "r1", Method: store.MethodMinted}); err != nil {
		t.Fatalf("RecordEnrollment: %v", err)
	}
	rn, err := st.GetRunner(ctx, "r1")
	if err != nil {
		t.Fatalf("GetRunner: %v", err)
	}
	if rn.Tenant != tenant {
		t.Fatalf("runner tenant %q, want the bootstrap tenant %q", rn.Tenant, tenant)
	}
	if again := bootstrap(t, st); again != tenant {
		t.Fatalf("BootstrapTenant changed from %q to %q", tenant, again)
	}
}

func testListNoHashes(t *testing.T, b Backend) {
	st, clock, _ := fresh(t, b)
	ctx := t.Context()
	type minted struct {
		token string
		info  store.TokenInfo
	}
	var all []minted
	for i, id := range []string{"r1", "r2", "r3"} {
		clock.Advance(time.Second)
		tok, info := mustMint(t, st, verifier.SubjectRunner, id)
		all = append(all, minted{tok, info})
		if i == 1 {
			clock.Advance(time.Second)
			if _, err := st.Revoke(ctx, info.ID); err != nil {
				t.Fatal(err)
			}
			all[i].info.RevokedAt = stored(clock.Now())
		}
	}
	list, err := st.ListTokens(ctx)
	if err != nil {
		t.Fatalf("ListTokens: %v", err)
	}
	if len(list) != len(all) {
		t.Fatalf("ListTokens returned %d tokens, want %d", len(list), len(all))
	}
	for i, got := range list {
		if got != all[i].info {
			t.Fatalf("ListTokens[%d] = %+v, want %+v (oldest first)", i, got, all[i].info)
		}
		text := fmt.Sprintf("%+v %#v", got, got)
		h := verifier.HashToken(all[i].token)
		for _, secret := range []string{
			all[i].token,
			hex.EncodeToString(h[:]),
			base64.StdEncoding.EncodeToString(h[:]),
			base64.RawURLEncoding.EncodeToString(h[:]),
			hex.EncodeToString(h[:6]),
		} {
			if strings.Contains(text, secret) {
				t.Fatalf("ListTokens[%d] exposes the token or its hash: %s", i, text)
			}
		}
	}
}

func testEnrollment(t *testing.T, b Backend) {
	st, clock, _ := fresh(t, b)
	ctx := t.Context()
	id := verifier.WorkloadRunnerID("prod-eks", "ip-10-0-1-5.ec2.internal")
	e := store.Enrollment{
		RunnerID: id, Method: store.MethodProjected, Cluster: "prod-eks",
		NodeName: "ip-10-0-1-5.ec2.internal", NodeUID: "node-uid-1", PodName: "compass-runner-abcde", PodUID: "pod-uid-1",
		Version: "v1.4.0", Hostname: "ip-10-0-1-5",
	}
	t0 := clock.Now()

	// First enrollment, at the store's clock (At is zero).
	res, err := st.RecordEnrollment(ctx, e)
	if err != nil {
		t.Fatalf("RecordEnrollment #1: %v", err)
	}
	if res != (store.EnrollResult{FirstEnrollment: true}) {
		t.Fatalf("RecordEnrollment #1 = %+v, want first enrollment only", res)
	}
	want := store.Runner{
		ID: id, Tenant: bootstrap(t, st), Method: store.MethodProjected, Cluster: "prod-eks",
		NodeName: e.NodeName, NodeUID: "node-uid-1", PodName: e.PodName, PodUID: "pod-uid-1",
		Version: "v1.4.0", Hostname: "ip-10-0-1-5",
		FirstEnrolledAt: stored(t0), LastEnrolledAt: stored(t0),
	}
	assertRunner(t, st, want)

	// The pod restarts on the same node, upgraded: a later enrollment, given
	// time, reporting a new version.
	e.PodName, e.PodUID, e.Version = "compass-runner-fghij", "pod-uid-2", "v1.5.0"
	t1 := t0.Add(10 * time.Minute)
	e.At = t1
	res, err = st.RecordEnrollment(ctx, e)
	if err != nil {
		t.Fatalf("RecordEnrollment #2: %v", err)
	}
	if res != (store.EnrollResult{PreviousNodeUID: "node-uid-1"}) {
		t.Fatalf("RecordEnrollment #2 = %+v, want not first, node UID unchanged", res)
	}
	want.PodName, want.PodUID, want.Version, want.LastEnrolledAt = e.PodName, e.PodUID, "v1.5.0", stored(t1)
	assertRunner(t, st, want)

	// The node is rebuilt under the same name: a new node UID.
	e.NodeUID = "node-uid-2"
	t2 := t1.Add(time.Hour)
	e.At = t2
	res, err = st.RecordEnrollment(ctx, e)
	if err != nil {
		t.Fatalf("RecordEnrollment #3: %v", err)
	}
	if res != (store.EnrollResult{NodeUIDChanged: true, PreviousNodeUID: "node-uid-1"}) {
		t.Fatalf("RecordEnrollment #3 = %+v, want node UID changed from node-uid-1", res)
	}
	want.NodeUID, want.LastEnrolledAt = "node-uid-2", stored(t2)
	assertRunner(t, st, want)

	// The same ID then enrolls with a minted token: no node UID, no change reported.
	t3 := t2.Add(time.Hour)
	res, err = st.RecordEnrollment(ctx, store.Enrollment{RunnerID: id, Method: store.MethodMinted, At: t3})
	if err != nil {
		t.Fatalf("RecordEnrollment #4: %v", err)
	}
	if res != (store.EnrollResult{PreviousNodeUID: "node-uid-2"}) {
		t.Fatalf("RecordEnrollment #4 = %+v, want no change for an enrollment without a node UID", res)
	}
	want = store.Runner{ID: id, Tenant: want.Tenant, Method: store.MethodMinted,
		FirstEnrolledAt: stored(t0), LastEnrolledAt: stored(t3)}
	assertRunner(t, st, want)

	// A second Runner; ListRunners orders by ID.
	if _, err := st.RecordEnrollment(ctx, store.Enrollment{RunnerID: "a-minted-runner", Method: store.MethodMinted, At: t3}); err != nil {
		t.Fatalf("RecordEnrollment(second runner): %v", err)
	}
	list, err := st.ListRunners(ctx)
	if err != nil {
		t.Fatalf("ListRunners: %v", err)
	}
	if len(list) != 2 || list[0].ID != "a-minted-runner" || list[1] != want {
		t.Fatalf("ListRunners = %+v, want a-minted-runner then %+v", list, want)
	}
	if _, err := st.GetRunner(ctx, "nobody"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("GetRunner(unknown) error = %v, want ErrNotFound", err)
	}
}

func assertRunner(t *testing.T, st store.Store, want store.Runner) {
	t.Helper()
	got, err := st.GetRunner(t.Context(), want.ID)
	if err != nil {
		t.Fatalf("GetRunner(%q): %v", want.ID, err)
	}
	if got != want {
		t.Fatalf("GetRunner(%q) =\n  %+v\nwant\n  %+v", want.ID, got, want)
	}
}

func testEnrollmentRejects(t *testing.T, b Backend) {
	st, _, _ := fresh(t, b)
	for _, tc := range []struct {
		name string
		e    store.Enrollment
	}{
		{"empty runner ID", store.Enrollment{Method: store.MethodMinted}},
		{"runner ID with dot", store.Enrollment{RunnerID: "a.b", Method: store.MethodMinted}},
		{"runner ID with wildcard", store.Enrollment{RunnerID: "a>", Method: store.MethodMinted}},
		{"runner ID too long", store.Enrollment{RunnerID: strings.Repeat("r", store.MaxRunnerIDLen+1), Method: store.MethodMinted}},
		{"unknown method", store.Enrollment{RunnerID: "r1", Method: "password"}},
		{"empty method", store.Enrollment{RunnerID: "r1"}},
		{"node name too long", store.Enrollment{RunnerID: "r1", Method: store.MethodProjected, NodeName: strings.Repeat("n", store.MaxEnrollmentFieldLen+1)}},
		{"version too long", store.Enrollment{RunnerID: "r1", Method: store.MethodMinted, Version: strings.Repeat("v", store.MaxReportedLen+1)}},
		{"hostname with an escape sequence", store.Enrollment{RunnerID: "r1", Method: store.MethodMinted, Hostname: "host\x1b[31m"}},
		{"hostname not UTF-8", store.Enrollment{RunnerID: "r1", Method: store.MethodMinted, Hostname: "host\xff"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := st.RecordEnrollment(t.Context(), tc.e)
			if !errors.Is(err, verifier.ErrInvalidArgument) {
				t.Fatalf("RecordEnrollment error = %v, want ErrInvalidArgument", err)
			}
		})
	}
	if list, err := st.ListRunners(t.Context()); err != nil || len(list) != 0 {
		t.Fatalf("after refused enrollments ListRunners = %+v, %v; want none", list, err)
	}
}

func testTouchRunner(t *testing.T, b Backend) {
	st, clock, _ := fresh(t, b)
	ctx := t.Context()
	if err := st.TouchRunner(ctx, "r1", clock.Now()); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("TouchRunner(unknown) error = %v, want ErrNotFound", err)
	}
	if _, err := st.RecordEnrollment(ctx, store.Enrollment{RunnerID: "r1", Method: store.MethodMinted}); err != nil {
		t.Fatal(err)
	}
	seen := func(want time.Time) {
		t.Helper()
		rn, err := st.GetRunner(ctx, "r1")
		if err != nil {
			t.Fatal(err)
		}
		if !rn.LastSeenAt.Equal(want) || (!want.IsZero() && rn.LastSeenAt.Location() != time.UTC) {
			t.Fatalf("LastSeenAt = %v, want %v", rn.LastSeenAt, want)
		}
	}
	seen(time.Time{})
	t1 := clock.Now().Add(time.Minute)
	for _, step := range []struct {
		at   time.Time
		want time.Time
	}{
		{t1, stored(t1)},
		{t1.Add(-30 * time.Second), stored(t1)}, // an older event does not move it back
		{t1.Add(time.Hour), stored(t1.Add(time.Hour))},
	} {
		if err := st.TouchRunner(ctx, "r1", step.at); err != nil {
			t.Fatalf("TouchRunner(%v): %v", step.at, err)
		}
		seen(step.want)
	}
	// A zero time means the store's clock, which is behind the last event here.
	if err := st.TouchRunner(ctx, "r1", time.Time{}); err != nil {
		t.Fatal(err)
	}
	seen(stored(t1.Add(time.Hour)))
	clock.Advance(2 * time.Hour)
	if err := st.TouchRunner(ctx, "r1", time.Time{}); err != nil {
		t.Fatal(err)
	}
	seen(stored(clock.Now()))
}

func testReopen(t *testing.T, b Backend) {
	url := b.NewURL(t)
	clock := NewClock(start)
	ctx := t.Context()
	st, err := store.Open(ctx, url, store.WithClock(clock.Now))
	if err != nil {
		t.Fatalf("Open #1: %v", err)
	}
	version, err := st.SchemaVersion(ctx)
	if err != nil {
		t.Fatalf("SchemaVersion: %v", err)
	}
	if version < 1 {
		t.Fatalf("SchemaVersion = %d after Open, want at least 1", version)
	}
	tenant := bootstrap(t, st)
	tok, _ := mustMint(t, st, verifier.SubjectRunner, "r1")
	if err := st.Close(); err != nil {
		t.Fatalf("Close #1: %v", err)
	}
	for i := 2; i <= 3; i++ {
		clock.Advance(time.Hour)
		st := open(t, url, clock)
		if v, err := st.SchemaVersion(ctx); err != nil || v != version {
			t.Fatalf("reopen #%d: SchemaVersion = %d, %v; want %d", i, v, err, version)
		}
		if got := bootstrap(t, st); got != tenant {
			t.Fatalf("reopen #%d: bootstrap tenant %q, want %q", i, got, tenant)
		}
		if _, err := verifier.NewResolver(nil, st).Resolve(ctx, tok, verifier.SubjectRunner); err != nil {
			t.Fatalf("reopen #%d: Resolve(token minted before): %v", i, err)
		}
	}
	if n := b.QueryInt(t, url, "SELECT count(*) FROM schema_migrations"); n != int64(version) {
		t.Fatalf("schema_migrations has %d rows, want %d (one per migration, applied once)", n, version)
	}
	if n := b.QueryInt(t, url, "SELECT count(*) FROM tenants"); n != 1 {
		t.Fatalf("tenants has %d rows after reopening, want 1", n)
	}
}

func testSchemaTooNew(t *testing.T, b Backend) {
	url := b.NewURL(t)
	clock := NewClock(start)
	st := open(t, url, clock)
	version, err := st.SchemaVersion(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	b.Exec(t, url, fmt.Sprintf("INSERT INTO schema_migrations (version, name, applied_at) VALUES (%d, 'from_the_future', '2030-01-01T00:00:00.000000Z')", version+1))
	st2, err := store.Open(t.Context(), url, store.WithClock(clock.Now))
	if !errors.Is(err, store.ErrSchemaTooNew) || !strings.Contains(err.Error(), fmt.Sprintf("at schema version %d, newer than the %d", version+1, version)) {
		if err == nil {
			_ = st2.Close()
		}
		t.Fatalf("Open on a newer schema: error = %v, want ErrSchemaTooNew", err)
	}
}

func testMintWithTTL(t *testing.T, b Backend) {
	st, clock, _ := fresh(t, b)
	ctx := t.Context()
	res := verifier.NewResolver(nil, st, verifier.WithResolverClock(clock.Now))
	const ttl = 90 * time.Minute
	created := stored(clock.Now())
	exp := stored(clock.Now().Add(ttl))

	tok, info, err := st.Mint(ctx, verifier.SubjectRunner, "ci-job-1", store.WithTTL(ttl))
	if err != nil {
		t.Fatalf("Mint with a TTL: %v", err)
	}
	want := store.TokenInfo{ID: info.ID, Kind: verifier.SubjectRunner, SubjectID: "ci-job-1", Tenant: bootstrap(t, st),
		CreatedAt: created, ExpiresAt: exp}
	if info != want {
		t.Fatalf("Mint info = %+v, want %+v", info, want)
	}
	// StoreTokenHash takes the same option.
	clock.Advance(time.Second) // ListTokens orders by creation
	other, err := verifier.GenerateToken()
	if err != nil {
		t.Fatal(err)
	}
	oinfo, err := st.StoreTokenHash(ctx, other, verifier.SubjectAccount, "contractor", store.WithTTL(time.Hour))
	if err != nil {
		t.Fatalf("StoreTokenHash with a TTL: %v", err)
	}
	if !oinfo.ExpiresAt.Equal(stored(clock.Now().Add(time.Hour))) {
		t.Fatalf("StoreTokenHash ExpiresAt = %v, want created + 1h", oinfo.ExpiresAt)
	}
	clock.Advance(time.Second)
	forever, finfo := mustMint(t, st, verifier.SubjectRunner, "build-host-1")
	if !finfo.ExpiresAt.IsZero() {
		t.Fatalf("a token minted without a TTL expires at %v", finfo.ExpiresAt)
	}

	m, err := st.LookupTokenHash(ctx, verifier.HashToken(tok))
	if err != nil {
		t.Fatalf("LookupTokenHash: %v", err)
	}
	if wantM := (verifier.MintedToken{Kind: verifier.SubjectRunner, ID: "ci-job-1", Tenant: want.Tenant, ExpiresAt: exp, TokenID: info.ID}); m != wantM {
		t.Fatalf("LookupTokenHash = %+v, want %+v", m, wantM)
	}
	list, err := st.ListTokens(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 3 || list[0] != info || list[1] != oinfo || list[2] != finfo {
		t.Fatalf("ListTokens = %+v, want %+v, %+v, %+v", list, info, oinfo, finfo)
	}
	if info.Expired(clock.Now()) || !info.Expired(exp) || finfo.Expired(exp.Add(1000*time.Hour)) {
		t.Fatal("TokenInfo.Expired disagrees with ExpiresAt")
	}

	// Resolves until just before the expiry, bounded by it; refused from it on.
	subj, err := res.Resolve(ctx, tok, verifier.SubjectRunner)
	if err != nil {
		t.Fatalf("Resolve before the expiry: %v", err)
	}
	if !subj.NotAfter.Equal(exp) || subj.ID != "ci-job-1" {
		t.Fatalf("Resolve = %+v, want ci-job-1 with NotAfter %v", subj, exp)
	}
	clock.Advance(exp.Sub(clock.Now()) - time.Microsecond)
	if _, err := res.Resolve(ctx, tok, verifier.SubjectRunner); err != nil {
		t.Fatalf("Resolve a microsecond before the expiry: %v", err)
	}
	clock.Advance(time.Microsecond)
	_, err = res.Resolve(ctx, tok, verifier.SubjectRunner)
	if !errors.Is(err, verifier.ErrTokenNotFound) || !errors.Is(err, verifier.ErrUnauthenticated) ||
		err.Error() != "verifier: token not found: token expired" {
		t.Fatalf("Resolve at the expiry = %v, want %q", err, "verifier: token not found: token expired")
	}
	if _, err := res.Resolve(ctx, other, verifier.SubjectAccount); err == nil {
		t.Fatal("the account token minted with a 1h TTL resolves 90 minutes later")
	}
	if _, err := res.Resolve(ctx, forever, verifier.SubjectRunner); err != nil {
		t.Fatalf("a token without a TTL stopped resolving: %v", err)
	}
	// Revoking an expired token still records the revocation.
	r, err := st.Revoke(ctx, info.ID)
	if err != nil || !r.Revoked() || !r.ExpiresAt.Equal(exp) {
		t.Fatalf("Revoke(expired) = %+v, %v", r, err)
	}
}

func testTTLRejects(t *testing.T, b Backend) {
	st, _, _ := fresh(t, b)
	ctx := t.Context()
	for _, tc := range []struct {
		ttl  time.Duration
		want string
	}{
		{0, "store: verifier: invalid argument: token TTL 0s is not positive"},
		{-time.Hour, "store: verifier: invalid argument: token TTL -1h0m0s is not positive"},
		{store.MinTokenTTL - time.Nanosecond, "store: verifier: invalid argument: token TTL 999.999999ms is under the minimum 1s"},
		{store.MaxTokenTTL + time.Nanosecond, "store: verifier: invalid argument: token TTL 8784h0m0.000000001s is over the maximum 8784h0m0s (366 days)"},
	} {
		_, _, err := st.Mint(ctx, verifier.SubjectRunner, "r1", store.WithTTL(tc.ttl))
		if !errors.Is(err, verifier.ErrInvalidArgument) || err.Error() != tc.want {
			t.Fatalf("Mint(TTL %s) error = %v, want %q", tc.ttl, err, tc.want)
		}
		tok, err := verifier.GenerateToken()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.StoreTokenHash(ctx, tok, verifier.SubjectRunner, "r1", store.WithTTL(tc.ttl)); err == nil || err.Error() != tc.want {
			t.Fatalf("StoreTokenHash(TTL %s) error = %v, want %q", tc.ttl, err, tc.want)
		}
	}
	if toks, err := st.ListTokens(ctx); err != nil || len(toks) != 0 {
		t.Fatalf("refused TTLs stored %d tokens (%v)", len(toks), err)
	}
	for _, ttl := range []time.Duration{store.MinTokenTTL, store.MaxTokenTTL} {
		if _, _, err := st.Mint(ctx, verifier.SubjectRunner, "r1", store.WithTTL(ttl)); err != nil {
			t.Fatalf("Mint(TTL %s), a bound itself: %v", ttl, err)
		}
	}
}

// Minting for an ID that has a token adds a second one; both resolve until
// each is revoked on its own (what mint-runner-token's help says).
func testSecondMint(t *testing.T, b Backend) {
	st, _, _ := fresh(t, b)
	ctx := t.Context()
	res := verifier.NewResolver(nil, st)
	first, finfo := mustMint(t, st, verifier.SubjectRunner, "build-01")
	second, sinfo := mustMint(t, st, verifier.SubjectRunner, "build-01")
	if first == second || finfo.ID == sinfo.ID {
		t.Fatal("the second mint returned the first token or public ID")
	}
	for _, tok := range []string{first, second} {
		if s, err := res.Resolve(ctx, tok, verifier.SubjectRunner); err != nil || s.ID != "build-01" {
			t.Fatalf("Resolve after the second mint = %+v, %v", s, err)
		}
	}
	if _, err := st.Revoke(ctx, finfo.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := res.Resolve(ctx, first, verifier.SubjectRunner); !errors.Is(err, verifier.ErrTokenNotFound) {
		t.Fatalf("the revoked first token: %v", err)
	}
	if _, err := res.Resolve(ctx, second, verifier.SubjectRunner); err != nil {
		t.Fatalf("revoking the first token stopped the second: %v", err)
	}
}

func testMigrateThenOpenCurrent(t *testing.T, b Backend) {
	url := b.NewURL(t)
	ctx := t.Context()
	wanted := store.SchemaVersionWanted()
	st, err := store.OpenCurrent(ctx, url)
	switch b.Name {
	case "sqlite":
		if !errors.Is(err, store.ErrNoDatabase) {
			t.Fatalf("OpenCurrent(no file) error = %v, want ErrNoDatabase", err)
		}
	default:
		want := fmt.Sprintf("store: the %s database has no schema yet (version 0) and this binary wants %d: run compass-server migrate", b.Name, wanted)
		if !errors.Is(err, store.ErrSchemaBehind) || err.Error() != want {
			t.Fatalf("OpenCurrent(empty database) error = %v, want %q", err, want)
		}
	}
	if st != nil {
		t.Fatal("OpenCurrent returned a store with an error")
	}

	res, err := store.Migrate(ctx, url)
	if err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	if res != (store.MigrateResult{Backend: b.Name, From: 0, To: wanted}) {
		t.Fatalf("Migrate = %+v, want from 0 to %d", res, wanted)
	}
	res, err = store.Migrate(ctx, url)
	if err != nil || res != (store.MigrateResult{Backend: b.Name, From: wanted, To: wanted}) {
		t.Fatalf("Migrate again = %+v, %v; want from %d to %d", res, err, wanted, wanted)
	}
	clock := NewClock(start)
	st, err = store.OpenCurrent(ctx, url, store.WithClock(clock.Now))
	if err != nil {
		t.Fatalf("OpenCurrent after Migrate: %v", err)
	}
	t.Cleanup(func() { _ = st.Close() })
	if v, err := st.SchemaVersion(ctx); err != nil || v != wanted {
		t.Fatalf("SchemaVersion = %d, %v; want %d", v, err, wanted)
	}
	tok, _ := mustMint(t, st, verifier.SubjectRunner, "r1")
	if _, err := verifier.NewResolver(nil, st).Resolve(ctx, tok, verifier.SubjectRunner); err != nil {
		t.Fatalf("Resolve on a store from OpenCurrent: %v", err)
	}
	if n := b.QueryInt(t, url, "SELECT count(*) FROM schema_migrations"); n != int64(wanted) {
		t.Fatalf("schema_migrations has %d rows, want %d", n, wanted)
	}
}

func testOpenCurrentRefuses(t *testing.T, b Backend) {
	url := b.NewURL(t)
	ctx := t.Context()
	wanted := store.SchemaVersionWanted()
	if _, err := store.Migrate(ctx, url); err != nil {
		t.Fatal(err)
	}
	// Behind: the last migration's record removed (OpenCurrent reads the
	// version only; the upgrade itself is TestUpgradeKeepsTokensAndRunners).
	b.Exec(t, url, fmt.Sprintf("DELETE FROM schema_migrations WHERE version = %d", wanted))
	st, err := store.OpenCurrent(ctx, url)
	want := fmt.Sprintf("store: the %s database is at schema version %d and this binary wants %d: run compass-server migrate", b.Name, wanted-1, wanted)
	var se *store.SchemaError
	if !errors.Is(err, store.ErrSchemaBehind) || errors.Is(err, store.ErrSchemaTooNew) || err.Error() != want ||
		!errors.As(err, &se) || *se != (store.SchemaError{Backend: b.Name, Found: wanted - 1, Wanted: wanted}) {
		t.Fatalf("OpenCurrent(behind) error = %v, want %q", err, want)
	}
	if st != nil {
		t.Fatal("OpenCurrent returned a store with an error")
	}
	if n := b.QueryInt(t, url, "SELECT count(*) FROM schema_migrations"); n != int64(wanted-1) {
		t.Fatalf("OpenCurrent changed schema_migrations: %d rows, want %d", n, wanted-1)
	}

	// Ahead: a newer binary's migration recorded.
	b.Exec(t, url, fmt.Sprintf("INSERT INTO schema_migrations (version, name, applied_at) VALUES (%d, '%04d_x', '2030-01-01T00:00:00.000000Z')", wanted, wanted))
	b.Exec(t, url, fmt.Sprintf("INSERT INTO schema_migrations (version, name, applied_at) VALUES (%d, 'from_the_future', '2030-01-01T00:00:00.000000Z')", wanted+1))
	want = fmt.Sprintf("store: the %s database is at schema version %d, newer than the %d this binary wants: a newer release migrated it; upgrade this binary", b.Name, wanted+1, wanted)
	for name, openFn := range map[string]func() (store.Store, error){
		"OpenCurrent": func() (store.Store, error) { return store.OpenCurrent(ctx, url) },
		"Open":        func() (store.Store, error) { return store.Open(ctx, url) },
		"Migrate": func() (store.Store, error) {
			_, err := store.Migrate(ctx, url)
			return nil, err
		},
	} {
		st, err := openFn()
		if !errors.Is(err, store.ErrSchemaTooNew) || errors.Is(err, store.ErrSchemaBehind) || err.Error() != want {
			t.Fatalf("%s(ahead) error = %v, want %q", name, err, want)
		}
		if st != nil {
			t.Fatalf("%s returned a store with an error", name)
		}
	}
	if n := b.QueryInt(t, url, "SELECT count(*) FROM schema_migrations"); n != int64(wanted+1) {
		t.Fatalf("a refused open changed schema_migrations: %d rows, want %d", n, wanted+1)
	}
}

// concurrentOpens is how many Servers race to migrate one new database.
const concurrentOpens = 4

func testConcurrentOpen(t *testing.T, b Backend) {
	url := b.NewURL(t)
	clock := NewClock(start)
	ctx := t.Context()
	stores := make([]store.Store, concurrentOpens)
	errs := make([]error, concurrentOpens)
	var wg sync.WaitGroup
	for i := range concurrentOpens {
		wg.Go(func() { stores[i], errs[i] = store.Open(ctx, url, store.WithClock(clock.Now)) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("concurrent Open #%d: %v", i, err)
			continue
		}
		t.Cleanup(func() { _ = stores[i].Close() })
	}
	if t.Failed() {
		t.FailNow()
	}
	version, err := stores[0].SchemaVersion(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n := b.QueryInt(t, url, "SELECT count(*) FROM schema_migrations"); n != int64(version) {
		t.Fatalf("schema_migrations has %d rows after %d concurrent Opens, want %d", n, concurrentOpens, version)
	}
	if n := b.QueryInt(t, url, "SELECT count(*) FROM tenants"); n != 1 {
		t.Fatalf("tenants has %d rows after %d concurrent Opens, want 1", n, concurrentOpens)
	}
}

// Concurrent use: workers mint, look up, revoke and enroll on one store at
// once; sized to finish in seconds under -race on two cores.
const (
	concurrentWorkers = 8
	tokensPerWorker   = 10
)

func testConcurrentUse(t *testing.T, b Backend) {
	st, clock, _ := fresh(t, b)
	ctx := t.Context()
	res := verifier.NewResolver(nil, st)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first int
		errs  []error
	)
	fail := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		errs = append(errs, err)
	}
	for w := range concurrentWorkers {
		wg.Go(func() {
			for i := range tokensPerWorker {
				id := fmt.Sprintf("w%d-r%d", w, i)
				tok, info, err := st.Mint(ctx, verifier.SubjectRunner, id)
				if err != nil {
					fail(fmt.Errorf("mint %s: %w", id, err))
					return
				}
				if subj, err := res.Resolve(ctx, tok, verifier.SubjectRunner); err != nil || subj.ID != id {
					fail(fmt.Errorf("resolve %s = %q, %w", id, subj.ID, err))
					return
				}
				if i%2 == 1 {
					if _, err := st.Revoke(ctx, info.ID); err != nil {
						fail(fmt.Errorf("revoke %s: %w", id, err))
						return
					}
				}
				// Every worker enrolls the same Runner; exactly one is first.
				r, err := st.RecordEnrollment(ctx, store.Enrollment{RunnerID: "shared", Method: store.MethodMinted, At: clock.Now()})
				if err != nil {
					fail(fmt.Errorf("record enrollment: %w", err))
					return
				}
				if err := st.TouchRunner(ctx, "shared", clock.Now()); err != nil {
					fail(fmt.Errorf("touch runner: %w", err))
					return
				}
				if r.FirstEnrollment {
					mu.Lock()
					first++
					mu.Unlock()
				}
				if _, err := st.ListTokens(ctx); err != nil {
					fail(fmt.Errorf("list tokens: %w", err))
					return
				}
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		t.FailNow()
	}
	if first != 1 {
		t.Fatalf("%d concurrent enrollments of one new Runner reported FirstEnrollment, want exactly 1", first)
	}
	list, err := st.ListTokens(ctx)
	if err != nil {
		t.Fatal(err)
	}
	revoked := 0
	for _, tk := range list {
		if tk.Revoked() {
			revoked++
		}
	}
	if len(list) != concurrentWorkers*tokensPerWorker || revoked != concurrentWorkers*tokensPerWorker/2 {
		t.Fatalf("after concurrent use: %d tokens, %d revoked; want %d and %d",
			len(list), revoked, concurrentWorkers*tokensPerWorker, concurrentWorkers*tokensPerWorker/2)
	}
}
