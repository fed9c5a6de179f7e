package door_test

import (
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/compass-runner/identity/kubeissuer"
	"github.com/compass-runner/identity/store"
	"github.com/compass-runner/identity/verifier"
)

// quarantine puts id in quarantine as compass-callout does: through its
// writer, displaced past a threshold of 1.
func (h *harness) quarantine(t *testing.T, id string) {
	t.Helper()
	w, err := store.OpenQuarantineWriter(t.Context(), h.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Close() }()
	for range 2 {
		if _, _, err := w.RecordDisplacement(t.Context(), store.Displacement{RunnerID: id, Newer: "10.0.0.2:40000", Older: "10.0.0.1:50000"},
			store.QuarantinePolicy{After: 1, Window: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
}

// Enroll refuses a quarantined Runner ID, minted or projected, with the
// door's one authentication failure (what a revoked token gets: the copy's
// holder is not told it was caught), logs why without the token, and
// enrolls it again once the quarantine is cleared; other Runners and a
// Runner displaced below the threshold are not affected.
func TestEnrollRefusesAQuarantinedRunnerID(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	revoked, info, err := h.st.Mint(t.Context(), verifier.SubjectRunner, "revoked-host")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.st.Revoke(t.Context(), info.ID); err != nil {
		t.Fatal(err)
	}
	_, revokedErr := h.enroll(t, revoked, "")
	wantCode(t, revokedErr, connect.CodeUnauthenticated, "unauthenticated")

	for _, tc := range []struct {
		name, id string
		token    func(t *testing.T) string
	}{
		{"minted", "build-host-a", func(t *testing.T) string { return h.mint(t, verifier.SubjectRunner, "build-host-a") }},
		{"projected", "prod/node-a", func(t *testing.T) string { return h.projected(t, h.prod, kubeissuer.Pod{NodeName: "node-a"}) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tok := tc.token(t)
			if _, err := h.enroll(t, tok, ""); err != nil {
				t.Fatalf("Enroll before the quarantine: %v", err)
			}
			h.quarantine(t, tc.id)
			_, err := h.enroll(t, tok, "")
			wantCode(t, err, connect.CodeUnauthenticated, "unauthenticated")
			if err.Error() != revokedErr.Error() {
				t.Fatalf("a quarantined ID's refusal %q differs from a revoked token's %q", err, revokedErr)
			}
			if !strings.Contains(h.logs.String(), "door: enroll: runner ID quarantined (a copied token); refused until compass-server clear-quarantine") {
				t.Fatal("the refusal is not logged")
			}
			h.noTokenInLogs(t, tok)
			if _, err := h.st.ClearQuarantine(t.Context(), tc.id); err != nil {
				t.Fatal(err)
			}
			if _, err := h.enroll(t, tok, ""); err != nil {
				t.Fatalf("Enroll after clear-quarantine: %v", err)
			}
		})
	}

	// Displaced once, below the threshold: enrolls.
	w, err := store.OpenQuarantineWriter(t.Context(), h.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Close() }()
	if _, _, err := w.RecordDisplacement(t.Context(), store.Displacement{RunnerID: "once"}, store.QuarantinePolicy{After: 1, Window: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.enroll(t, h.mint(t, verifier.SubjectRunner, "once"), ""); err != nil {
		t.Fatalf("Enroll of an ID displaced once: %v", err)
	}
}
