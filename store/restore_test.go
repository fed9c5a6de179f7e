package store_test

import (
	"bytes"
	"errors"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/compass-runner/identity/store"
	"github.com/compass-runner/identity/store/storetest"
	"github.com/compass-runner/identity/verifier"
)

// restoreBackend is how one backend takes a backup and restores it.
type restoreBackend struct {
	name string
	// newDB returns the URL of a new, empty database.
	newDB func(t *testing.T) string
	// backup copies the database at url as the documented backup does and
	// returns the copy made ready to restore: SQLite, the backup file's path
	// (compass-server backup); PostgreSQL, a new database the dump was
	// pg_restored into. copyURL opens that copy.
	backup func(t *testing.T, url string, clock *storetest.Clock) (handle, copyURL string)
	// restore restores handle in place of the database at url, the
	// replaced database being the one at replaced ("" when it is lost).
	restore func(t *testing.T, url, handle, replaced string, o store.RestoreOptions) (served string, rep store.RestoreReport, err error)
	// stamped: the backup carries the time it was taken.
	stamped bool
}

func sqliteRestoreBackend() restoreBackend {
	return restoreBackend{
		name: "sqlite",
		newDB: func(t *testing.T) string {
			return "sqlite://" + filepath.Join(t.TempDir(), "data", "compass.db")
		},
		backup: func(t *testing.T, url string, clock *storetest.Clock) (string, string) {
			to := filepath.Join(t.TempDir(), "compass-backup.db")
			if _, err := store.Backup(t.Context(), url, to, store.WithClock(clock.Now)); err != nil {
				t.Fatalf("Backup: %v", err)
			}
			return to, "sqlite://" + to
		},
		restore: func(t *testing.T, url, handle, replaced string, o store.RestoreOptions) (string, store.RestoreReport, error) {
			f, err := os.Open(handle)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			rep, err := store.Restore(t.Context(), url, f, o)
			return url, rep, err
		},
		stamped: true,
	}
}

func postgresRestoreBackend(t *testing.T) restoreBackend {
	admin := postgresURL(t)
	pgDump, pgRestore := pgTool(t, "pg_dump"), pgTool(t, "pg_restore")
	return restoreBackend{
		name:  "postgres",
		newDB: func(t *testing.T) string { return newDatabase(t, admin, "compass_restore_") },
		backup: func(t *testing.T, url string, _ *storetest.Clock) (string, string) {
			dump := filepath.Join(t.TempDir(), "compass.dump")
			dst := newDatabase(t, admin, "compass_restored_")
			runTool(t, pgDump, "--format=custom", "--no-owner", "--file", dump, "--dbname", url)
			runTool(t, pgRestore, "--no-owner", "--exit-on-error", "--single-transaction", "--dbname", dst, dump)
			return dst, dst
		},
		restore: func(t *testing.T, _, handle, replaced string, o store.RestoreOptions) (string, store.RestoreReport, error) {
			o.Replaced = replaced
			rep, err := store.Reconcile(t.Context(), handle, o)
			return handle, rep, err
		},
	}
}

func runTool(t *testing.T, name string, args ...string) {
	t.Helper()
	out, err := exec.CommandContext(t.Context(), name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", filepath.Base(name), strings.Join(args, " "), err, out)
	}
}

// eachRestoreBackend runs fn on SQLite and on PostgreSQL.
func eachRestoreBackend(t *testing.T, fn func(t *testing.T, b restoreBackend)) {
	t.Run("sqlite", func(t *testing.T) { fn(t, sqliteRestoreBackend()) })
	t.Run("postgres", func(t *testing.T) { fn(t, postgresRestoreBackend(t)) })
}

// restoreFixture is a database with a backup taken in the middle of its
// life: what was done before the backup, and what after.
type restoreFixture struct {
	url, handle, copyURL string
	clock                *storetest.Clock
	takenAt              time.Time

	kept, revokedAfter, mintedAfter string // tokens
	revokedAfterInfo                store.TokenInfo
	mintedAfterInfo                 store.TokenInfo
}

// newRestoreFixture mints tokens and enrolls a Runner, takes a backup, then
// revokes a token the backup holds live, mints one it does not hold, mints
// and revokes another, and enrolls a second Runner.
func newRestoreFixture(t *testing.T, b restoreBackend) *restoreFixture {
	t.Helper()
	ctx := t.Context()
	f := &restoreFixture{url: b.newDB(t), clock: storetest.NewClock(time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC))}
	st, err := store.Open(ctx, f.url, store.WithClock(f.clock.Now))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	mint := func(id string) (string, store.TokenInfo) {
		t.Helper()
		f.clock.Advance(time.Second)
		tok, info, err := st.Mint(ctx, verifier.SubjectRunner, id)
		if err != nil {
			t.Fatal(err)
		}
		return tok, info
	}
	f.kept, _ = mint("kept")
	f.revokedAfter, f.revokedAfterInfo = mint("revoked-after")
	_, before := mint("revoked-before")
	if _, err := st.Revoke(ctx, before.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := st.RecordEnrollment(ctx, store.Enrollment{RunnerID: "kept", Method: store.MethodMinted}); err != nil {
		t.Fatal(err)
	}

	f.clock.Advance(time.Minute)
	f.takenAt = f.clock.Now()
	f.handle, f.copyURL = b.backup(t, f.url, f.clock)

	f.clock.Advance(time.Minute)
	if f.revokedAfterInfo, err = st.Revoke(ctx, f.revokedAfterInfo.ID); err != nil {
		t.Fatal(err)
	}
	f.mintedAfter, f.mintedAfterInfo = mint("minted-after")
	_, gone := mint("minted-and-revoked-after")
	if _, err := st.Revoke(ctx, gone.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := st.RecordEnrollment(ctx, store.Enrollment{RunnerID: "minted-after", Method: store.MethodMinted}); err != nil {
		t.Fatal(err)
	}
	return f
}

// resolves reports whether token resolves against the store at url, opened
// as serve opens it.
func resolves(t *testing.T, url, token string) bool {
	t.Helper()
	st, err := store.OpenServing(t.Context(), url)
	if err != nil {
		t.Fatalf("OpenServing(restored): %v", err)
	}
	defer st.Close()
	_, err = verifier.NewResolver(nil, st).Resolve(t.Context(), token, verifier.SubjectRunner)
	if err != nil && !errors.Is(err, verifier.ErrTokenNotFound) {
		t.Fatalf("Resolve: %v", err)
	}
	return err == nil
}

func ids(ts []store.TokenInfo) []string {
	out := []string{}
	for _, t := range ts {
		out = append(out, t.SubjectID)
	}
	return out
}

// A backup is refused for serving until restored; the restore re-applies the
// revocation made after the backup (at its original time), reports the token
// minted after it as lost and the Runner enrolled after it, and the restored
// database serves: the kept token resolves, the revoked and the lost ones do
// not. Restoring again finds nothing more to do.
func TestRestoreReappliesLaterRevocations(t *testing.T) {
	eachRestoreBackend(t, func(t *testing.T, b restoreBackend) {
		ctx := t.Context()
		f := newRestoreFixture(t, b)

		_, err := store.OpenServing(ctx, f.copyURL)
		var ue *store.UnrestoredError
		if !errors.As(err, &ue) || !errors.Is(err, store.ErrUnrestoredBackup) || ue.Backend != b.name {
			t.Fatalf("OpenServing(the backup): %v, want an *UnrestoredError for %s", err, b.name)
		}
		wantTaken := time.Time{}
		if b.stamped {
			wantTaken = f.takenAt
		}
		if !ue.BackupTakenAt.Equal(wantTaken) {
			t.Fatalf("the refusal says the backup was taken at %v, want %v", ue.BackupTakenAt, wantTaken)
		}
		if !strings.Contains(err.Error(), "compass-server restore") || !strings.Contains(err.Error(), "--i-know-revocations-may-be-lost") {
			t.Fatalf("the refusal does not say what to run: %v", err)
		}
		// The operator commands still read it (list-tokens on a copy).
		cp, err := store.OpenCurrent(ctx, f.copyURL)
		if err != nil {
			t.Fatalf("OpenCurrent(the backup): %v", err)
		}
		_ = cp.Close()

		restoreAt := f.clock.Now().Add(time.Hour)
		served, rep, err := b.restore(t, f.url, f.handle, f.url, store.RestoreOptions{Now: func() time.Time { return restoreAt }})
		if err != nil {
			t.Fatalf("restore: %v", err)
		}
		if !rep.Compared || rep.Backend != b.name || rep.SchemaFrom != store.SchemaVersionWanted() || !rep.BackupTakenAt.Equal(wantTaken) {
			t.Fatalf("report %+v", rep)
		}
		if got := ids(rep.Reapplied); !slices.Equal(got, []string{"revoked-after"}) || !rep.Reapplied[0].RevokedAt.Equal(f.revokedAfterInfo.RevokedAt) {
			t.Fatalf("reapplied %+v, want revoked-after at %v", rep.Reapplied, f.revokedAfterInfo.RevokedAt)
		}
		if got := ids(rep.Lost); !slices.Equal(got, []string{"minted-after"}) || rep.Lost[0].ID != f.mintedAfterInfo.ID {
			t.Fatalf("lost %+v, want minted-after", rep.Lost)
		}
		if rep.RunnersLost != 1 || len(rep.Unchecked) != 0 {
			t.Fatalf("runners lost %d, unchecked %v; want 1 and none", rep.RunnersLost, rep.Unchecked)
		}

		for _, tc := range []struct {
			name, token string
			want        bool
		}{
			{"kept", f.kept, true},
			{"revoked after the backup", f.revokedAfter, false},
			{"minted after the backup", f.mintedAfter, false},
		} {
			if got := resolves(t, served, tc.token); got != tc.want {
				t.Errorf("%s: resolves %v, want %v", tc.name, got, tc.want)
			}
		}
		st, err := store.OpenServing(ctx, served)
		if err != nil {
			t.Fatal(err)
		}
		toks, err := st.ListTokens(ctx)
		_ = st.Close()
		if err != nil {
			t.Fatal(err)
		}
		for _, tok := range toks {
			if tok.ID == f.revokedAfterInfo.ID && !tok.RevokedAt.Equal(f.revokedAfterInfo.RevokedAt) {
				t.Fatalf("the revocation was re-applied at %v, want its original time %v", tok.RevokedAt, f.revokedAfterInfo.RevokedAt)
			}
		}
		if b.name == "sqlite" {
			assertKeptReplaced(t, f, rep, restoreAt)
		}
	})
}

// assertKeptReplaced checks that the SQLite restore kept the replaced file,
// which still holds the token minted after the backup, and left no
// temporary file or WAL of another database beside the restored one.
func assertKeptReplaced(t *testing.T, f *restoreFixture, rep store.RestoreReport, at time.Time) {
	t.Helper()
	path := strings.TrimPrefix(f.url, "sqlite://")
	if rep.Kept != path+".replaced-"+at.Format("20060102T150405Z") {
		t.Fatalf("kept the replaced database at %q", rep.Kept)
	}
	old, err := store.OpenCurrent(t.Context(), "sqlite://"+rep.Kept)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	_, err = verifier.NewResolver(nil, old).Resolve(t.Context(), f.mintedAfter, verifier.SubjectRunner)
	if err != nil {
		t.Fatalf("the kept replaced database lost the token minted after the backup: %v", err)
	}
	entries, err := os.ReadDir(filepath.Dir(path))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.Contains(e.Name(), ".tmp") {
			t.Fatalf("restore left %s behind", e.Name())
		}
	}
}

// Without the replaced database the restore is refused, and the backup stays
// refused for serving; accepting the loss restores it and lists the backup's
// live tokens, any of which may have been revoked since.
func TestRestoreWithoutTheReplacedDatabaseNeedsTheOperatorsWord(t *testing.T) {
	eachRestoreBackend(t, func(t *testing.T, b restoreBackend) {
		ctx := t.Context()
		f := newRestoreFixture(t, b)
		target := f.url
		if b.name == "sqlite" {
			// The disaster: the data directory is gone.
			target = "sqlite://" + filepath.Join(t.TempDir(), "new", "compass.db")
		}
		_, _, err := b.restore(t, target, f.handle, "", store.RestoreOptions{})
		if !errors.Is(err, store.ErrNoReplacedDatabase) || !strings.Contains(err.Error(), "--i-know-revocations-may-be-lost") {
			t.Fatalf("restore without the replaced database: %v, want ErrNoReplacedDatabase naming the flag", err)
		}
		if b.name == "sqlite" {
			if _, err := os.Stat(filepath.Dir(strings.TrimPrefix(target, "sqlite://"))); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("a refused restore made the data directory: %v", err)
			}
		} else if _, err := store.OpenServing(ctx, f.copyURL); !errors.Is(err, store.ErrUnrestoredBackup) {
			t.Fatalf("a refused restore left the copy servable: %v", err)
		}

		served, rep, err := b.restore(t, target, f.handle, "", store.RestoreOptions{AcceptLostRevocations: true})
		if err != nil {
			t.Fatalf("restore accepting the loss: %v", err)
		}
		if rep.Compared || len(rep.Reapplied) != 0 || len(rep.Lost) != 0 || rep.Kept != "" {
			t.Fatalf("report %+v", rep)
		}
		if got := ids(rep.Unchecked); !slices.Equal(got, []string{"kept", "revoked-after"}) {
			t.Fatalf("unchecked %v, want the backup's live tokens kept and revoked-after", got)
		}
		// What the operator accepted: the token revoked after the backup is
		// live again until revoked anew.
		if !resolves(t, served, f.revokedAfter) || !resolves(t, served, f.kept) {
			t.Fatal("the accepted restore does not serve the backup's live tokens")
		}
	})
}

// Without the replaced database, the safe answer: every token live in the
// backup is revoked with the stamp's clearing, so the one revoked after the
// backup stays refused (and so does every other, listed for new mints); a
// dry run lists them and changes nothing; the two answers together, or with
// a replaced database named, are refused.
func TestRestoreWithoutTheReplacedDatabaseRevokingEveryLiveToken(t *testing.T) {
	eachRestoreBackend(t, func(t *testing.T, b restoreBackend) {
		ctx := t.Context()
		f := newRestoreFixture(t, b)
		target := f.url
		if b.name == "sqlite" {
			target = "sqlite://" + filepath.Join(t.TempDir(), "new", "compass.db")
		}
		for _, tc := range []struct {
			replaced string
			o        store.RestoreOptions
		}{
			{"", store.RestoreOptions{RevokeEveryLiveToken: true, AcceptLostRevocations: true}},
			{f.url, store.RestoreOptions{RevokeEveryLiveToken: true, Replaced: f.url}},
		} {
			if _, _, err := b.restore(t, target, f.handle, tc.replaced, tc.o); err == nil {
				t.Fatalf("restore with %+v succeeded", tc.o)
			}
		}
		if b.name != "sqlite" {
			if _, err := store.OpenServing(ctx, f.copyURL); !errors.Is(err, store.ErrUnrestoredBackup) {
				t.Fatalf("a refused restore left the copy servable: %v", err)
			}
			_, rep, err := b.restore(t, target, f.handle, "", store.RestoreOptions{RevokeEveryLiveToken: true, DryRun: true})
			if err != nil || !slices.Equal(ids(rep.RevokedLive), []string{"kept", "revoked-after"}) {
				t.Fatalf("dry run: %+v, %v", rep, err)
			}
			if _, err := store.OpenServing(ctx, f.copyURL); !errors.Is(err, store.ErrUnrestoredBackup) {
				t.Fatalf("a dry run left the copy servable: %v", err)
			}
		}

		served, rep, err := b.restore(t, target, f.handle, "", store.RestoreOptions{RevokeEveryLiveToken: true, Now: f.clock.Now})
		if err != nil {
			t.Fatalf("restore revoking every live token: %v", err)
		}
		if rep.Compared || len(rep.Unchecked) != 0 || len(rep.Reapplied) != 0 {
			t.Fatalf("report %+v", rep)
		}
		if got := ids(rep.RevokedLive); !slices.Equal(got, []string{"kept", "revoked-after"}) {
			t.Fatalf("revoked %v, want the backup's live tokens kept and revoked-after", got)
		}
		for _, rt := range rep.RevokedLive {
			if !rt.RevokedAt.Equal(f.clock.Now().Truncate(time.Microsecond)) {
				t.Errorf("%s revoked at %s, want the restore's time %s", rt.SubjectID, rt.RevokedAt, f.clock.Now())
			}
		}
		if resolves(t, served, f.revokedAfter) || resolves(t, served, f.kept) {
			t.Fatal("a token live in the backup still resolves")
		}
	})
}

// The restore refuses to name the restored database as the one it replaces.
func TestReconcileRefusesItselfAsTheReplacedDatabase(t *testing.T) {
	eachRestoreBackend(t, func(t *testing.T, b restoreBackend) {
		f := newRestoreFixture(t, b)
		_, err := store.Reconcile(t.Context(), f.copyURL, store.RestoreOptions{Replaced: f.copyURL})
		if err == nil || !strings.Contains(err.Error(), "the replaced database is the restored database itself") {
			t.Fatalf("Reconcile with itself: %v", err)
		}
		if _, err := store.OpenServing(t.Context(), f.copyURL); !errors.Is(err, store.ErrUnrestoredBackup) {
			t.Fatalf("a refused Reconcile left the copy servable: %v", err)
		}
	})
}

// SQLite: a backup put in place by hand (the copy over the database) is
// refused by serve; Reconcile in place, with the replaced file kept
// elsewhere, re-applies its revocations and lets it serve.
func TestSQLiteBackupPutInPlaceByHandIsRefusedUntilReconciled(t *testing.T) {
	b := sqliteRestoreBackend()
	f := newRestoreFixture(t, b)
	path := strings.TrimPrefix(f.url, "sqlite://")
	aside := path + ".old"
	if err := os.Rename(path, aside); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"-wal", "-shm"} {
		_ = os.Remove(path + s)
	}
	data, err := os.ReadFile(f.handle)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := store.OpenServing(t.Context(), f.url); !errors.Is(err, store.ErrUnrestoredBackup) {
		t.Fatalf("OpenServing(a backup put in place): %v", err)
	}
	// The Server pod's init container refuses it too, before serve would.
	if _, err := store.CheckSchema(t.Context(), f.url); !errors.Is(err, store.ErrUnrestoredBackup) {
		t.Fatalf("CheckSchema(a backup put in place): %v", err)
	}
	rep, err := store.Reconcile(t.Context(), f.url, store.RestoreOptions{Replaced: "sqlite://" + aside})
	if err != nil {
		t.Fatalf("Reconcile: %v", err)
	}
	if !slices.Equal(ids(rep.Reapplied), []string{"revoked-after"}) || !slices.Equal(ids(rep.Lost), []string{"minted-after"}) {
		t.Fatalf("report %+v", rep)
	}
	if resolves(t, f.url, f.revokedAfter) || !resolves(t, f.url, f.kept) {
		t.Fatal("the reconciled database serves the token revoked after the backup, or not the kept one")
	}
	if _, err := store.CheckSchema(t.Context(), f.url); err != nil {
		t.Fatalf("CheckSchema after the reconcile: %v", err)
	}
}

// failingReader gives some bytes of a backup, then fails, as a broken
// kubectl exec stream does.
type failingReader struct{ r io.Reader }

func (f *failingReader) Read(p []byte) (int, error) {
	n, err := f.r.Read(p)
	if err == io.EOF {
		return n, errors.New("stream cut")
	}
	return n, err
}

// A failed SQLite restore leaves the database as it was, byte for byte, and
// nothing beside it: a backup that is not a database, one cut short, one from
// a newer release, and a database still open in a Server.
func TestSQLiteFailedRestoreLeavesTheDatabase(t *testing.T) {
	b := sqliteRestoreBackend()
	f := newRestoreFixture(t, b)
	ctx := t.Context()
	path := strings.TrimPrefix(f.url, "sqlite://")
	backup, err := os.ReadFile(f.handle)
	if err != nil {
		t.Fatal(err)
	}
	newer := filepath.Join(t.TempDir(), "newer.db")
	if err := os.WriteFile(newer, backup, 0o600); err != nil {
		t.Fatal(err)
	}
	storetest.RawSQLite(t, "sqlite://"+newer).ExecContext(ctx,
		`INSERT INTO schema_migrations (version, name, applied_at) VALUES (99, '0099_future', '2030-01-01T00:00:00.000000Z')`)
	newerBytes, err := os.ReadFile(newer)
	if err != nil {
		t.Fatal(err)
	}
	snapshot := func() map[string]string { return dirBytes(t, filepath.Dir(path)) }
	before := snapshot()

	for _, tc := range []struct {
		name   string
		backup func() io.Reader
		inUse  bool
		want   func(error) bool
	}{
		{"not a database", func() io.Reader { return strings.NewReader(strings.Repeat("not sqlite ", 100)) }, false,
			func(err error) bool { return errors.Is(err, store.ErrNotADatabase) }},
		{"empty", func() io.Reader { return strings.NewReader("") }, false,
			func(err error) bool { return errors.Is(err, store.ErrNotADatabase) }},
		{"cut short", func() io.Reader { return &failingReader{bytes.NewReader(backup[:len(backup)/2])} }, false,
			func(err error) bool { return err != nil && strings.Contains(err.Error(), "stream cut") }},
		{"from a newer release", func() io.Reader { return bytes.NewReader(newerBytes) }, false,
			func(err error) bool { return errors.Is(err, store.ErrSchemaTooNew) }},
		{"database in use", func() io.Reader { return bytes.NewReader(backup) }, true,
			func(err error) bool { return errors.Is(err, store.ErrDatabaseInUse) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.inUse {
				st := storetest.Open(t, f.url)
				if _, err := st.ListTokens(ctx); err != nil {
					t.Fatal(err)
				}
				defer st.Close()
			}
			_, err := store.Restore(ctx, f.url, tc.backup(), store.RestoreOptions{})
			if !tc.want(err) {
				t.Fatalf("Restore: %v", err)
			}
			if tc.inUse {
				return // the open store may have written its WAL; the check below is for the others
			}
			if after := snapshot(); !maps.Equal(after, before) {
				t.Fatalf("a failed restore changed the data directory: %d files, before %d", len(after), len(before))
			}
		})
	}
	if !resolves(t, f.url, f.mintedAfter) {
		t.Fatal("after the failed restores the database lost a token")
	}
}

// BackupTo stamps its stream as Backup stamps its file, and the stamped copy
// is one file (no -wal beside it).
func TestSQLiteBackupsAreStamped(t *testing.T) {
	ctx := t.Context()
	url := "sqlite://" + filepath.Join(t.TempDir(), "compass.db")
	storetest.Open(t, url)
	taken := time.Date(2026, 6, 1, 8, 0, 0, 0, time.UTC)
	var buf bytes.Buffer
	if _, err := store.BackupTo(ctx, url, &buf, store.WithClock(func() time.Time { return taken })); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	streamed := filepath.Join(dir, "streamed.db")
	if err := os.WriteFile(streamed, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "file.db")
	if _, err := store.Backup(ctx, url, file, store.WithClock(func() time.Time { return taken })); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(file + "-wal"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the backup has a -wal file beside it: %v", err)
	}
	for _, p := range []string{streamed, file} {
		_, err := store.OpenServing(ctx, "sqlite://"+p)
		var ue *store.UnrestoredError
		if !errors.As(err, &ue) || !ue.BackupTakenAt.Equal(taken) {
			t.Fatalf("OpenServing(%s): %v, want an *UnrestoredError taken at %v", filepath.Base(p), err, taken)
		}
	}
	// The live database itself is not stamped.
	st, err := store.OpenServing(ctx, url)
	if err != nil {
		t.Fatalf("OpenServing(the live database): %v", err)
	}
	_ = st.Close()
}

// A dry run reports what the restore would do and changes nothing: the
// SQLite data directory keeps its files byte for byte, the restored
// PostgreSQL database stays refused with the revoked token still live in it;
// the restore that follows reports the same.
func TestRestoreDryRunChangesNothing(t *testing.T) {
	eachRestoreBackend(t, func(t *testing.T, b restoreBackend) {
		ctx := t.Context()
		f := newRestoreFixture(t, b)
		var before map[string]string
		path := strings.TrimPrefix(f.url, "sqlite://")
		if b.name == "sqlite" {
			before = dirBytes(t, filepath.Dir(path))
		}
		_, dry, err := b.restore(t, f.url, f.handle, f.url, store.RestoreOptions{DryRun: true})
		if err != nil {
			t.Fatalf("dry run: %v", err)
		}
		if !slices.Equal(ids(dry.Reapplied), []string{"revoked-after"}) || !slices.Equal(ids(dry.Lost), []string{"minted-after"}) || dry.Kept != "" {
			t.Fatalf("dry run report %+v", dry)
		}
		if b.name == "sqlite" {
			if after := dirBytes(t, filepath.Dir(path)); !maps.Equal(after, before) {
				t.Fatalf("a dry run changed the data directory: %v files, before %v", len(after), len(before))
			}
			if !resolves(t, f.url, f.mintedAfter) {
				t.Fatal("a dry run replaced the database")
			}
		} else {
			if _, err := store.OpenServing(ctx, f.copyURL); !errors.Is(err, store.ErrUnrestoredBackup) {
				t.Fatalf("a dry run left the copy servable: %v", err)
			}
			cp, err := store.OpenCurrent(ctx, f.copyURL)
			if err != nil {
				t.Fatal(err)
			}
			_, err = verifier.NewResolver(nil, cp).Resolve(ctx, f.revokedAfter, verifier.SubjectRunner)
			_ = cp.Close()
			if err != nil {
				t.Fatalf("a dry run revoked a token in the copy: %v", err)
			}
		}
		_, rep, err := b.restore(t, f.url, f.handle, f.url, store.RestoreOptions{})
		if err != nil || !slices.Equal(ids(rep.Reapplied), ids(dry.Reapplied)) || !slices.Equal(ids(rep.Lost), ids(dry.Lost)) {
			t.Fatalf("the restore after the dry run: %+v, %v", rep, err)
		}
	})
}

// dirBytes reads every file in dir.
func dirBytes(t *testing.T, dir string) map[string]string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = string(data)
	}
	return out
}
