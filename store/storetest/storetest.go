// Package storetest is the conformance suite every store backend passes. A
// backend's tests call Run with a Backend that makes fresh databases.
package storetest

import (
	"crypto/sha256"
	"errors"
	"testing"
	"time"

	"github.com/compass-runner/identity/internal/lib/testutil"
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

// Clock is a settable clock for store.WithClock (testutil.Clock).
type Clock = testutil.Clock

// NewClock returns a clock stopped at start.
func NewClock(start time.Time) *Clock { return testutil.NewClock(start) }

// Open opens the store at url (creating and migrating it) and closes it when
// the test ends: one process's handle on a database others may share.
func Open(t testing.TB, url string) store.Store {
	t.Helper()
	st, err := store.Open(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	return st
}

// OpenCurrent migrates the store at url, as compass-server migrate does,
// then opens it as compass-callout does (refusing any other schema), and
// closes it when the test ends.
func OpenCurrent(t testing.TB, url string) store.Store {
	t.Helper()
	if _, err := store.Migrate(t.Context(), url); err != nil {
		t.Fatal(err)
	}
	st, err := store.OpenCurrent(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	return st
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
		{"ReadOnly", testReadOnly},
		{"QuarantineBoundary", testQuarantineBoundary},
		{"QuarantineClear", testQuarantineClear},
		{"QuarantineRejects", testQuarantineRejects},
		{"QuarantineShared", testQuarantineShared},
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
