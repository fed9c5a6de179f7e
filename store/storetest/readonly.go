package storetest

import (
	"errors"
	"testing"

	"github.com/compass-runner/identity/store"
	"github.com/compass-runner/identity/verifier"
)

// testReadOnly: a store opened with store.ReadOnly, as compass-callout
// opens it, reads what the writer wrote and fails every write, which then
// left nothing behind; an opener that would create or migrate refuses it.
func testReadOnly(t *testing.T, b Backend) {
	st, clock, url := fresh(t, b)
	ctx := t.Context()
	tok, info, err := st.Mint(ctx, verifier.SubjectRunner, "runner-1")
	if err != nil {
		t.Fatalf("Mint: %v", err)
	}
	e := store.Enrollment{RunnerID: "runner-1", Method: store.MethodMinted}
	if _, err := st.RecordEnrollment(ctx, e); err != nil {
		t.Fatalf("RecordEnrollment: %v", err)
	}

	ro, err := store.OpenCurrent(ctx, url, store.ReadOnly())
	if err != nil {
		t.Fatalf("OpenCurrent read-only: %v", err)
	}
	t.Cleanup(func() { _ = ro.Close() })

	// What the callout reads.
	if _, err := ro.SchemaVersion(ctx); err != nil {
		t.Fatalf("SchemaVersion: %v", err)
	}
	m, err := ro.LookupTokenHash(ctx, verifier.HashToken(tok))
	if err != nil || m.ID != "runner-1" || m.TokenID != info.ID {
		t.Fatalf("LookupTokenHash = %+v, %v", m, err)
	}
	if list, err := ro.ListTokens(ctx); err != nil || len(list) != 1 {
		t.Fatalf("ListTokens = %v, %v; want the one token", list, err)
	}
	if _, err := ro.CountRunnerTokenIDsWithSlash(ctx); err != nil {
		t.Fatalf("CountRunnerTokenIDsWithSlash: %v", err)
	}
	if qs, err := ro.ListQuarantined(ctx); err != nil || len(qs) != 0 {
		t.Fatalf("ListQuarantined = %v, %v; want none", qs, err)
	}
	if _, err := ro.GetQuarantine(ctx, "runner-1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("GetQuarantine = %v; want ErrNotFound", err)
	}

	// Every write fails.
	writes := map[string]func() error{
		"Mint": func() error { _, _, err := ro.Mint(ctx, verifier.SubjectAccount, "intruder"); return err },
		"StoreTokenHash": func() error {
			_, err := ro.StoreTokenHash(ctx, "cmp_"+info.ID+"_not-a-token", verifier.SubjectAccount, "intruder")
			return err
		},
		"Revoke":           func() error { _, err := ro.Revoke(ctx, info.ID); return err },
		"RecordEnrollment": func() error { _, err := ro.RecordEnrollment(ctx, e); return err },
		"TouchRunner":      func() error { return ro.TouchRunner(ctx, "runner-1", clock.Now()) },
		"ClearQuarantine":  func() error { _, err := ro.ClearQuarantine(ctx, "runner-1"); return err },
	}
	for name, write := range writes {
		if err := write(); err == nil {
			t.Errorf("%s through the read-only store succeeded", name)
		}
	}
	// Nothing was written.
	list, err := st.ListTokens(ctx)
	if err != nil || len(list) != 1 || !list[0].RevokedAt.IsZero() {
		t.Fatalf("after the refused writes: tokens %+v, %v; want the one, not revoked", list, err)
	}
	r, err := st.GetRunner(ctx, "runner-1")
	if err != nil || !r.LastSeenAt.IsZero() {
		t.Fatalf("after the refused writes: runner %+v, %v; want never seen", r, err)
	}

	// Openers that would create or migrate refuse it.
	const refused = "store: a read-only store cannot be created or migrated"
	if _, err := store.Open(ctx, url, store.ReadOnly()); err == nil || err.Error() != refused {
		t.Fatalf("store.Open with ReadOnly: %v; want %q", err, refused)
	}
	if _, err := store.Migrate(ctx, url, store.ReadOnly()); err == nil || err.Error() != refused {
		t.Fatalf("store.Migrate with ReadOnly: %v; want %q", err, refused)
	}
}
