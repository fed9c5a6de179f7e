package kube

import (
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/go-jose/go-jose/v4"

	"github.com/compass-runner/identity/verifier"
)

// Signing-key rotation on a real API server: restarted with a new signing key
// and the old key still published, tokens of both keys verify (the new kid
// through the verifier's kid-miss re-fetch); restarted without the old key,
// old tokens fail after the verifier's next refresh while new ones verify.
func TestLiveKeyRotation(t *testing.T) {
	assets := requireBinaries(t)
	ctx := t.Context()
	e, err := newEnv(ctx, assets, "rotation", false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.close(); err != nil {
			t.Error(err)
		}
	})
	pod, err := e.srv.createRunnerPod(ctx, runnerNode)
	if err != nil {
		t.Fatal(err)
	}
	oldKey := e.key
	oldTok, err := kubeletToken(ctx, e.srv, runnerNode, pod)
	if err != nil {
		t.Fatal(err)
	}
	var loads atomic.Int32
	v := loadedVerifier(t, e.clusterFile, verifier.WithLoadHook(func(verifier.LoadEvent) { loads.Add(1) }))
	mustVerify(t, v, oldTok, "before rotation, old token")

	// Step 1: new signing key, old key still published.
	newKey, err := newRSAKey(e.dir, "rotation-sa-2")
	if err != nil {
		t.Fatal(err)
	}
	if err := e.srv.restart(ctx, serverSpec{name: "rotation", signing: newKey, extra: []*saKey{oldKey}}); err != nil {
		t.Fatal(err)
	}
	if got := publishedKIDs(t, e.srv); !slices.Equal(got, sortedStrings(oldKey.kid(), newKey.kid())) {
		t.Fatalf("published kids = %v, want old and new", got)
	}
	newTok, err := kubeletToken(ctx, e.srv, runnerNode, pod)
	if err != nil {
		t.Fatal(err)
	}
	if kid := jwtPart(t, newTok, 0)["kid"]; kid != newKey.kid() {
		t.Fatalf("token after rotation has kid %v, want the new key's", kid)
	}
	before := loads.Load()
	mustVerify(t, v, newTok, "after rotation, new token")
	if got := loads.Load() - before; got != 1 {
		t.Errorf("key loads for the new kid = %d, want exactly 1 (the kid-miss re-fetch)", got)
	}
	mustVerify(t, v, oldTok, "after rotation, old token")

	// Step 2: old key removed.
	if err := e.srv.restart(ctx, serverSpec{name: "rotation", signing: newKey}); err != nil {
		t.Fatal(err)
	}
	if got := publishedKIDs(t, e.srv); !slices.Equal(got, []string{newKey.kid()}) {
		t.Fatalf("published kids = %v, want only the new key", got)
	}
	st, err := e.srv.reviewToken(ctx, oldTok, runnerAudience)
	if err != nil {
		t.Fatal(err)
	}
	if st.Authenticated {
		t.Fatal("the API server still accepts the old token after removing its key")
	}
	if err := v.Refresh(ctx); err != nil { // the hourly refresh, brought forward
		t.Fatal(err)
	}
	_, err = v.Verify(ctx, oldTok)
	if !errors.Is(err, verifier.ErrUnauthenticated) || errors.Is(err, verifier.ErrKeysUnavailable) ||
		verifier.ClusterOf(err) != "live" || !strings.HasSuffix(err.Error(), ": no key with that kid") {
		t.Errorf("old token after its key was removed: error %v, want ErrUnauthenticated for cluster live, no key with that kid", err)
	}
	mustVerify(t, v, newTok, "after removal, new token")
}

func mustVerify(t *testing.T, v *verifier.RunnerVerifier, tok, what string) {
	t.Helper()
	subj, err := v.Verify(t.Context(), tok)
	if err != nil {
		t.Fatalf("%s: Verify: %v", what, err)
	}
	if subj.ID != runnerID {
		t.Fatalf("%s: Runner ID %q, want %q", what, subj.ID, runnerID)
	}
}

// publishedKIDs are the kids of the server's anonymous JWKS, sorted.
func publishedKIDs(t *testing.T, s *apiServer) []string {
	t.Helper()
	code, body, err := s.getAnonymous(t.Context(), "/openid/v1/jwks")
	if err != nil || code != http.StatusOK {
		t.Fatalf("JWKS: status %d, %v", code, err)
	}
	var set jose.JSONWebKeySet
	if err := json.Unmarshal(body, &set); err != nil {
		t.Fatal(err)
	}
	var kids []string
	for _, k := range set.Keys {
		kids = append(kids, k.KeyID)
	}
	slices.Sort(kids)
	return kids
}

func sortedStrings(s ...string) []string {
	slices.Sort(s)
	return s
}
