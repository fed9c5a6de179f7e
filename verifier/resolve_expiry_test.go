package verifier

import (
	"context"
	"crypto/sha256"
	"errors"
	"testing"
	"time"
)

// putExpiring stores a minted token that expires at exp.
func (s *spyStore) putExpiring(t *testing.T, kind SubjectKind, id string, exp time.Time) string {
	t.Helper()
	tok := s.put(t, kind, id, false)
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.rows[HashToken(tok)]
	m.ExpiresAt = exp
	s.rows[HashToken(tok)] = m
	return tok
}

// A minted token with an expiry resolves until just before it, with the
// expiry as Subject.NotAfter (what the callout caps the user JWT at); from
// the expiry on it fails exactly as an unknown token does, with the cause
// "token expired". A token without an expiry never expires.
func TestResolve_MintedExpiry(t *testing.T) {
	clk := newClock()
	exp := clk.Now().Add(time.Hour)
	st := &spyStore{}
	r := NewResolver(nil, st, WithResolverClock(clk.Now))
	runnerTok := st.putExpiring(t, SubjectRunner, "ci-job-1", exp)
	accountTok := st.putExpiring(t, SubjectAccount, "contractor", exp)
	forever := st.put(t, SubjectRunner, "build-host-1", false)
	set := clk.Set

	for _, tc := range []struct {
		tok  string
		kind SubjectKind
		id   string
	}{{runnerTok, SubjectRunner, "ci-job-1"}, {accountTok, SubjectAccount, "contractor"}} {
		for _, at := range []time.Time{exp.Add(-time.Hour), exp.Add(-time.Microsecond)} {
			set(at)
			sub, err := r.Resolve(context.Background(), tc.tok, tc.kind)
			record(tc.tok, err)
			if err != nil {
				t.Fatalf("Resolve(%s) at expiry-%s: %v", tc.id, exp.Sub(at), err)
			}
			want := Subject{Kind: tc.kind, ID: tc.id, Tenant: "tenant-1", Expiry: exp, NotAfter: exp}
			if sub != want {
				t.Fatalf("Resolve(%s) = %+v, want %+v", tc.id, sub, want)
			}
		}
		for _, at := range []time.Time{exp, exp.Add(time.Nanosecond), exp.Add(365 * 24 * time.Hour)} {
			set(at)
			_, err := r.Resolve(context.Background(), tc.tok, tc.kind)
			record(tc.tok, err)
			if !errors.Is(err, ErrTokenNotFound) || !errors.Is(err, ErrUnauthenticated) || !errors.Is(err, errExpired) {
				t.Fatalf("Resolve(%s) at expiry+%s = %v, want ErrTokenNotFound with the cause token expired", tc.id, at.Sub(exp), err)
			}
			if got, want := err.Error(), "verifier: token not found: token expired"; got != want {
				t.Fatalf("error %q, want %q", got, want)
			}
		}
	}
	// The same failure shape as an unknown token: only the cause differs.
	_, unknown := r.Resolve(context.Background(), "bm90LWEtdG9rZW4", SubjectRunner)
	var eu, ee *Error
	_, expired := r.Resolve(context.Background(), runnerTok, SubjectRunner)
	if !errors.As(unknown, &eu) || !errors.As(expired, &ee) || eu.Kind != ee.Kind || eu.Cluster != ee.Cluster {
		t.Fatalf("unknown %#v and expired %#v differ in shape", unknown, expired)
	}

	// No expiry: resolves however late it is, with no bound.
	sub, err := r.Resolve(context.Background(), forever, SubjectRunner)
	if err != nil || !sub.NotAfter.IsZero() || !sub.Expiry.IsZero() {
		t.Fatalf("Resolve(token without expiry) = %+v, %v; want no bound", sub, err)
	}
}

// The Resolver judges minted expiry by the verifier's clock unless told
// otherwise, and by time.Now without a verifier.
func TestResolve_ClockDefaults(t *testing.T) {
	clk := newClock()
	v := newVerifier(t, clk)
	st := &spyStore{rows: map[[sha256.Size]byte]MintedToken{}}
	// Expired by the verifier's clock (an hour ahead of the wall clock), not by time.Now.
	exp := time.Now().Add(30 * time.Minute)
	clk.Advance(time.Hour)
	tok := st.putExpiring(t, SubjectRunner, "r1", exp)
	if _, err := NewResolver(v, st).Resolve(context.Background(), tok, SubjectRunner); !errors.Is(err, errExpired) {
		t.Fatalf("with the verifier's clock an hour on: %v, want expired", err)
	}
	if _, err := NewResolver(nil, st).Resolve(context.Background(), tok, SubjectRunner); err != nil {
		t.Fatalf("without a verifier (time.Now): %v", err)
	}
	// WithResolverClock overrides the verifier's clock; nil keeps it.
	early := func() time.Time { return exp.Add(-time.Minute) }
	if _, err := NewResolver(v, st, WithResolverClock(early)).Resolve(context.Background(), tok, SubjectRunner); err != nil {
		t.Fatalf("with an earlier clock: %v", err)
	}
	if _, err := NewResolver(v, st, WithResolverClock(nil)).Resolve(context.Background(), tok, SubjectRunner); !errors.Is(err, errExpired) {
		t.Fatalf("WithResolverClock(nil): %v, want the verifier's clock kept", err)
	}
}
