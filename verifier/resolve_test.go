package verifier

import (
	"github.com/nats-io/nkeys"

	"context"
	"crypto/sha256"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/compass-runner/identity/kubeissuer"
)

// spyStore is an in-memory TokenStore that records every lookup. It stands in
// for the Server's SQL stores, whose own conformance suite runs elsewhere; here
// what matters is which tokens reach a store at all.
type spyStore struct {
	mu      sync.Mutex
	rows    map[[sha256.Size]byte]MintedToken
	lookups int
	fail    error
}

func (s *spyStore) LookupTokenHash(_ context.Context, h [sha256.Size]byte) (MintedToken, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lookups++
	if s.fail != nil {
		return MintedToken{}, s.fail
	}
	m, ok := s.rows[h]
	if !ok {
		return MintedToken{}, ErrTokenNotFound
	}
	return m, nil
}

func (s *spyStore) put(t *testing.T, kind SubjectKind, id string, revoked bool) string {
	t.Helper()
	tok, err := GenerateToken()
	if err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.rows == nil {
		s.rows = map[[sha256.Size]byte]MintedToken{}
	}
	s.rows[HashToken(tok)] = MintedToken{Kind: kind, ID: id, Tenant: "tenant-1", Revoked: revoked}
	return tok
}

func (s *spyStore) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lookups
}

func TestResolve(t *testing.T) {
	_, is, v := loadedProd(t, kubeissuer.RS256)
	st := &spyStore{}
	r := NewResolver(v, st)
	runnerTok := st.put(t, SubjectRunner, "build-host-1", false)
	accountTok := st.put(t, SubjectAccount, "ops", false)
	revokedTok := st.put(t, SubjectRunner, "old-host", true)
	// A row minted before "/" was reserved: it must not speak for prod's node.
	slashTok := st.put(t, SubjectRunner, "prod/ip-10-0-1-5_ec2_internal", false)
	projected := mustToken(t, is, "ip-10-0-1-5.ec2.internal")

	cases := []struct {
		name     string
		tok      string
		want     SubjectKind
		id       string
		errs     []error
		lookups  int // store lookups the case may cause
		notCause error
	}{
		{"projected on the runner door", projected, SubjectRunner, "prod/ip-10-0-1-5_ec2_internal", nil, 0, nil},
		{"projected on the account door", projected, SubjectAccount, "", []error{ErrWrongKind, ErrUnauthenticated}, 0, nil},
		{"JWS-shaped garbage on the runner door", "a.b.c", SubjectRunner, "", []error{ErrUnauthenticated}, 0, nil},
		{"minted runner token", runnerTok, SubjectRunner, "build-host-1", nil, 1, nil},
		{"minted account token", accountTok, SubjectAccount, "ops", nil, 1, nil},
		{"minted account token on the runner door", accountTok, SubjectRunner, "", []error{ErrWrongKind, ErrUnauthenticated}, 1, nil},
		{"minted runner token on the account door", runnerTok, SubjectAccount, "", []error{ErrWrongKind, ErrUnauthenticated}, 1, nil},
		{"revoked", revokedTok, SubjectRunner, "", []error{ErrTokenNotFound, ErrUnauthenticated, errRevoked}, 1, nil},
		{"minted runner ID with a slash", slashTok, SubjectRunner, "", []error{ErrUnauthenticated, errReservedRunnerID}, 1, nil},
		{"unknown minted token", "bm90LWEtdG9rZW4", SubjectRunner, "", []error{ErrTokenNotFound, ErrUnauthenticated}, 1, nil},
		{"one dot never reaches the store", "abc.def", SubjectRunner, "", []error{ErrTokenNotFound, ErrUnauthenticated}, 0, nil},
		{"empty", "", SubjectRunner, "", []error{ErrTokenNotFound, ErrUnauthenticated}, 0, nil},
		{"oversized never reaches the store", strings.Repeat("x", MaxTokenBytes+1), SubjectRunner, "", []error{ErrTokenNotFound}, 0, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := st.count()
			sub, err := r.Resolve(context.Background(), tc.tok, tc.want)
			record(tc.tok, err)
			if got := st.count() - before; got != tc.lookups {
				t.Fatalf("%d store lookups, want %d", got, tc.lookups)
			}
			if tc.errs == nil {
				if err != nil {
					t.Fatalf("Resolve: %v", err)
				}
				if sub.ID != tc.id || sub.Kind != tc.want || sub.Tenant != "tenant-1" {
					t.Fatalf("subject = %+v", sub)
				}
				return
			}
			for _, e := range tc.errs {
				if !errors.Is(err, e) {
					t.Fatalf("err = %v, want errors.Is %v", err, e)
				}
			}
			if errors.Is(err, ErrKeysUnavailable) {
				t.Fatalf("err = %v is keys-unavailable", err)
			}
		})
	}
}

// With no cluster registered, a JWS-shaped token is not found (and never
// looked up as a minted token); without a store, a minted one is not found.
func TestResolve_NothingConfigured(t *testing.T) {
	st := &spyStore{}
	r := NewResolver(nil, st)
	_, err := r.Resolve(context.Background(), "a.b.c", SubjectRunner)
	if !errors.Is(err, ErrTokenNotFound) || !errors.Is(err, errNoClusters) || st.count() != 0 {
		t.Fatalf("err = %v, lookups = %d", err, st.count())
	}
	empty, _ := New(nil)
	_, err = NewResolver(empty, st).Resolve(context.Background(), "a.b.c", SubjectRunner)
	if !errors.Is(err, ErrTokenNotFound) || st.count() != 0 {
		t.Fatalf("empty verifier: err = %v", err)
	}
	_, err = NewResolver(nil, nil).Resolve(context.Background(), "bm90LWEtdG9rZW4", SubjectRunner)
	if !errors.Is(err, ErrTokenNotFound) || !errors.Is(err, errNoStore) {
		t.Fatalf("no store: err = %v", err)
	}
}

// A store failure is unauthenticated for the caller, with the cause kept for logs.
func TestResolve_StoreFailure(t *testing.T) {
	boom := errors.New("connection refused")
	st := &spyStore{fail: boom}
	_, err := NewResolver(nil, st).Resolve(context.Background(), "bm90LWEtdG9rZW4", SubjectRunner)
	if !errors.Is(err, ErrUnauthenticated) || !errors.Is(err, boom) || errors.Is(err, ErrTokenNotFound) {
		t.Fatalf("err = %v", err)
	}
	st.fail = nil
	st.rows = map[[sha256.Size]byte]MintedToken{HashToken("dG9r"): {Kind: SubjectKind(7), ID: "x"}}
	if _, err := NewResolver(nil, st).Resolve(context.Background(), "dG9r", SubjectRunner); !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("unknown stored kind: %v", err)
	}
}

func TestMintedTokenRules(t *testing.T) {
	tok, err := GenerateToken()
	if err != nil {
		t.Fatal(err)
	}
	if len(tok) != 43 || LooksLikeJWT(tok) || strings.ContainsAny(tok, ".+/=") || CheckMintedToken(tok) != nil {
		t.Fatalf("generated token has the wrong shape (len %d)", len(tok))
	}
	if other, _ := GenerateToken(); other == tok {
		t.Fatal("two generated tokens are equal")
	}
	for _, bad := range []string{"", "a.b", strings.Repeat("a", MaxTokenBytes+1)} {
		if err := CheckMintedToken(bad); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("CheckMintedToken(len %d) = %v", len(bad), err)
		}
	}
	ok := []struct {
		kind SubjectKind
		id   string
	}{{SubjectRunner, "build-host-1"}, {SubjectAccount, "ops"}, {SubjectAccount, "team/ops"}}
	for _, c := range ok {
		if err := CheckSubjectID(c.kind, c.id); err != nil {
			t.Errorf("CheckSubjectID(%v, %q) = %v", c.kind, c.id, err)
		}
	}
	bad := []struct {
		kind SubjectKind
		id   string
	}{{SubjectRunner, "a/b"}, {SubjectRunner, ""}, {SubjectRunner, "a.b"}, {SubjectRunner, "*"}, {SubjectRunner, ">"},
		{SubjectRunner, "a b"}, {SubjectRunner, "a\x00"}, {SubjectRunner, strings.Repeat("a", MaxSubjectIDLen+1)}, {SubjectKind(9), "a"}}
	for _, c := range bad {
		if err := CheckSubjectID(c.kind, c.id); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("CheckSubjectID(%v, %q) = %v, want invalid argument", c.kind, c.id, err)
		}
	}
}

func TestWorkloadRunnerID(t *testing.T) {
	id := WorkloadRunnerID("prod-eks", "ip-10-0-1-5.ec2.internal")
	if id != "prod-eks/ip-10-0-1-5_ec2_internal" {
		t.Fatalf("id = %q", id)
	}
	c, n, ok := SplitWorkloadRunnerID(id)
	if !ok || c != "prod-eks" || n != "ip-10-0-1-5.ec2.internal" {
		t.Fatalf("split = %q %q %v", c, n, ok)
	}
	if _, _, ok := SplitWorkloadRunnerID("build-host-1"); ok {
		t.Fatal("a minted ID split")
	}
}

// The minted token and subject ID limits, at the limit and one past it.
func TestMintedLimits(t *testing.T) {
	if err := CheckMintedToken(strings.Repeat("a", 16384)); err != nil {
		t.Fatalf("a token of 16384 bytes: %v", err)
	}
	if err := CheckMintedToken(strings.Repeat("a", 16385)); !errors.Is(err, ErrInvalidArgument) || err.Error() != "verifier: invalid argument: token longer than 16384 bytes" {
		t.Fatalf("a token of 16385 bytes: %v", err)
	}
	if err := CheckSubjectID(SubjectRunner, strings.Repeat("a", 128)); err != nil {
		t.Fatalf("an ID of 128 bytes: %v", err)
	}
	if err := CheckSubjectID(SubjectRunner, strings.Repeat("a", 129)); !errors.Is(err, ErrInvalidArgument) || err.Error() != "verifier: invalid argument: runner ID longer than 128 bytes" {
		t.Fatalf("an ID of 129 bytes: %v", err)
	}
}

// slashCounter is the store's side of CheckReservedRunnerIDs, as the store
// answers it.
type slashCounter struct {
	n     int64
	err   error
	calls int
}

func (s *slashCounter) CountRunnerTokenIDsWithSlash(context.Context) (int64, error) {
	s.calls++
	return s.n, s.err
}

func TestCheckReservedRunnerIDs(t *testing.T) {
	boom := errors.New("database is locked")
	for _, tc := range []struct {
		name      string
		st        *slashCounter
		clusters  int
		want      string // "" = nil
		is        error
		wantCalls int
	}{
		{"no clusters: the store is not asked", &slashCounter{n: 3}, 0, "", nil, 0},
		{"none with a slash", &slashCounter{}, 1, "", nil, 1},
		{"one with a slash", &slashCounter{n: 1}, 2, `verifier: minted Runner tokens with "/" in their ID exist while runner clusters are registered: 1 such token(s); revoke them (compass-server list-tokens, then revoke-token ID) and mint new ones without "/", or start without --runner-clusters`, ErrReservedRunnerIDs, 1},
		{"the store fails", &slashCounter{err: boom}, 1, `verifier: count minted Runner tokens with "/": database is locked`, boom, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckReservedRunnerIDs(t.Context(), tc.st, tc.clusters)
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
			} else if err == nil || err.Error() != tc.want || !errors.Is(err, tc.is) {
				t.Fatalf("err = %v, want %s", err, tc.want)
			}
			if tc.st.calls != tc.wantCalls {
				t.Fatalf("store asked %d times, want %d", tc.st.calls, tc.wantCalls)
			}
		})
	}
	if err := CheckReservedRunnerIDs(t.Context(), nil, 1); err != nil {
		t.Fatalf("no store: %v", err)
	}
}

// The kinds are stored as integers (1 account, 2 runner), so the values are
// part of the stores' format; the zero value is no kind.
func TestSubjectKindValues(t *testing.T) {
	for _, tc := range []struct {
		k     SubjectKind
		valid bool
		s     string
	}{{0, false, "SubjectKind(0)"}, {1, true, "account"}, {2, true, "runner"}, {3, false, "SubjectKind(3)"}} {
		if tc.k.Valid() != tc.valid || tc.k.String() != tc.s {
			t.Errorf("SubjectKind(%d): valid %v, %q; want %v, %q", int(tc.k), tc.k.Valid(), tc.k, tc.valid, tc.s)
		}
	}
	if SubjectAccount != 1 || SubjectRunner != 2 {
		t.Fatalf("account = %d, runner = %d: the stored values changed", SubjectAccount, SubjectRunner)
	}
}

func TestSplitWorkloadRunnerID_Refuses(t *testing.T) {
	for _, id := range []string{"", "build-host-1", "/node-a", "prod/", "/"} {
		if c, n, ok := SplitWorkloadRunnerID(id); ok || c != "" || n != "" {
			t.Errorf("SplitWorkloadRunnerID(%q) = %q, %q, %v; want refused", id, c, n, ok)
		}
	}
}

// A minted Runner ID may not be a NATS user key: the kicker tells the
// callout's users from the others by it. Another kind of key (an
// account's) is a plain name.
func TestCheckSubjectIDRefusesAUserKey(t *testing.T) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	user, _ := kp.PublicKey()
	want := "verifier: invalid argument: runner ID \"" + user + "\" is a NATS user key, which names users the callout did not issue"
	if err := CheckSubjectID(SubjectRunner, user); !errors.Is(err, ErrInvalidArgument) || err.Error() != want {
		t.Fatalf("CheckSubjectID(a user key) = %v, want %q", err, want)
	}
	akp, err := nkeys.CreateAccount()
	if err != nil {
		t.Fatal(err)
	}
	account, _ := akp.PublicKey()
	if err := CheckSubjectID(SubjectRunner, account); err != nil {
		t.Errorf("CheckSubjectID(an account key) = %v, want nil", err)
	}
	if err := CheckSubjectID(SubjectAccount, user); err != nil {
		t.Errorf("CheckSubjectID(account, a user key) = %v, want nil: only Runner IDs name NATS users", err)
	}
}
