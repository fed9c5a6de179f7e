package storetest

import (
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/compass-runner/identity/store"
	"github.com/compass-runner/identity/verifier"
)

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
