package clusterfile_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/compass-runner/identity/kubeissuer"
	"github.com/compass-runner/identity/verifier/clusterfile"
)

const pulledErr = "verifier: unauthenticated: cluster a: no key with that kid"

// pullKey rotates e's issuer to a new signing key and removes the old one
// from its JWKS, as an operator does with a leaked key. It returns a token
// signed with the old key, taken before, and one signed with the new key.
func (e *env) pullKey(t *testing.T) (oldTok, newTok string) {
	t.Helper()
	oldTok, err := e.is.Token(kubeissuer.Pod{NodeName: node}, 0)
	if err != nil {
		t.Fatal(err)
	}
	kid := e.is.SigningKey().KeyID
	if _, err := e.is.Rotate(); err != nil {
		t.Fatal(err)
	}
	e.is.Unpublish(kid)
	if newTok, err = e.is.Token(kubeissuer.Pod{NodeName: node}, 0); err != nil {
		t.Fatal(err)
	}
	return oldTok, newTok
}

// verifyTok presents tok to the registry's verifier.
func (r *running) verifyTok(t *testing.T, tok string) error {
	t.Helper()
	_, err := r.reg.Verifier().Verify(t.Context(), tok)
	return err
}

// SIGHUP re-fetches the key set of a cluster the file leaves unchanged: a
// key removed at the issuer stops verifying once the signal is handled (the
// token signed with it was verified before, so the verified-token cache is
// crossed too), and the new key verifies. The file itself is not applied
// again, and nothing is fetched without a signal.
func TestRun_SIGHUPRefetchesUnchangedClusters(t *testing.T) {
	e := newEnv(t)
	e.publish(t, e.file())
	r := start(t, e, clusterfile.Config{})
	oldTok, newTok := e.pullKey(t)
	if err := r.verifyTok(t, oldTok); err != nil {
		t.Fatalf("the old key before SIGHUP: %v", err)
	}
	fetches := e.is.JWKSFetches()
	r.poll(t)
	if got := e.is.JWKSFetches() - fetches; got != 0 {
		t.Fatalf("%d key fetches on a poll of an unchanged file, want 0", got)
	}

	r.sighup(t)
	if got := e.is.JWKSFetches() - fetches; got != 1 {
		t.Fatalf("%d key fetches on SIGHUP, want 1", got)
	}
	if err := r.verifyTok(t, oldTok); err == nil || err.Error() != pulledErr {
		t.Fatalf("the removed key after SIGHUP: %v, want %s", err, pulledErr)
	}
	if err := r.verifyTok(t, newTok); err != nil {
		t.Fatalf("the new key after SIGHUP: %v", err)
	}
	if got := r.metrics(t); got != metricsWant(0, 0, 0) {
		t.Fatalf("metrics (the unchanged file is not applied again):\n%s", got)
	}
	if !strings.Contains(r.log.String(), `msg="clusterfile: key sets fetched again" path=`+e.path+" trigger=SIGHUP clusters=[a]") {
		t.Fatalf("log:\n%s", r.log)
	}
}

// A poll that sees the file changed re-fetches every key set after applying
// it, and so does a SIGHUP that finds the file refused: the clusters in
// force are fetched again whatever came of the file.
func TestRun_ChangedFileRefetchesKeys(t *testing.T) {
	e := newEnv(t)
	e.publish(t, e.file())
	r := start(t, e, clusterfile.Config{})
	oldTok, newTok := e.pullKey(t)
	e.publish(t, e.file(other))
	r.poll(t)
	if err := r.verifyTok(t, oldTok); err == nil || err.Error() != pulledErr {
		t.Fatalf("the removed key after a changed file: %v, want %s", err, pulledErr)
	}
	if err := r.verifyTok(t, newTok); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(r.log.String(), "trigger=\"file changed\"") {
		t.Fatalf("log:\n%s", r.log)
	}

	e.publish(t, "clusters: [")
	r.poll(t)
	oldTok, newTok = e.pullKey(t)
	fetches := e.is.JWKSFetches()
	r.sighup(t)
	if got := e.is.JWKSFetches() - fetches; got != 1 {
		t.Fatalf("%d key fetches on SIGHUP with a refused file, want 1", got)
	}
	if err := r.verifyTok(t, oldTok); err == nil || err.Error() != pulledErr {
		t.Fatalf("the removed key after SIGHUP with a refused file: %v, want %s", err, pulledErr)
	}
	if err := r.verifyTok(t, newTok); err != nil {
		t.Fatal(err)
	}
	if got := r.metrics(t); got != metricsWant(1, 2, 1) {
		t.Fatalf("metrics:\n%s", got)
	}
}

// The new file takes effect before the re-fetch and without it: with the
// issuer down, a new deny entry refuses its node at once, the last good key
// set keeps verifying the others, and Reload returns the re-fetch's failure
// (ErrRefetch) apart from the file's outcome.
func TestReload_RefetchFailureKeepsKeysAndFile(t *testing.T) {
	e := newEnv(t)
	e.publish(t, e.file())
	r := start(t, e, clusterfile.Config{})
	e.down.Store(true)
	e.publish(t, e.file(node))
	err := r.reg.Reload(t.Context())
	if !errors.Is(err, clusterfile.ErrRefetch) || errors.Is(err, clusterfile.ErrRefused) ||
		!strings.Contains(err.Error(), `verifier: cluster "a": key re-fetch: discovery: GET `) {
		t.Fatalf("Reload with the issuer down: %v", err)
	}
	if err := r.verify(t, e, node); err == nil || err.Error() != deniedErr {
		t.Fatalf("the denied node: %v, want %s", err, deniedErr)
	}
	if err := r.verify(t, e, other); err != nil {
		t.Fatalf("another node on the last good key set: %v", err)
	}
	if got := r.metrics(t); got != metricsWant(1, 0, 0) {
		t.Fatalf("metrics:\n%s", got)
	}
	if !strings.Contains(r.log.String(), `level=WARN msg="clusterfile: key sets not fetched again; the last good ones stay in force" path=`+e.path+" trigger=reload") {
		t.Fatalf("log:\n%s", r.log)
	}
}
