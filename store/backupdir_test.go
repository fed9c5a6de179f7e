package store_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/compass-runner/identity/store"
	"github.com/compass-runner/identity/store/storetest"
)

// A scheduled backup: each run writes compass-<time>.db into the directory
// and keeps the newest keep copies; what it did not name is never touched,
// and each copy opens with the tokens it was taken with.
func TestBackupToDirKeepsTheNewestCopies(t *testing.T) {
	dir := t.TempDir()
	st, _, url, clock := sqliteInDataDir(t, dir)
	defer st.Close()
	want := writeBackupState(t, st, clock)

	out := filepath.Join(dir, "backups")
	if err := os.Mkdir(out, 0o700); err != nil {
		t.Fatal(err)
	}
	// Another file in the directory, named almost like a copy: retention
	// must leave it.
	other := filepath.Join(out, "compass-notes.db")
	if err := os.WriteFile(other, []byte("keep me"), 0o600); err != nil {
		t.Fatal(err)
	}
	at := storetest.NewClock(time.Date(2026, 12, 3, 3, 0, 0, 0, time.UTC))
	var made []string
	for i := range 4 {
		res, err := store.BackupToDir(t.Context(), url, out, 3, store.WithClock(at.Now))
		if err != nil {
			t.Fatalf("run %d: %v", i, err)
		}
		if wantFile := filepath.Join(out, store.BackupName(at.Now())); res.File != wantFile {
			t.Fatalf("run %d wrote %s, want %s", i, res.File, wantFile)
		}
		if res.SchemaVersion != store.SchemaVersionWanted() {
			t.Fatalf("run %d: schema version %d, want %d", i, res.SchemaVersion, store.SchemaVersionWanted())
		}
		made = append(made, res.File)
		switch {
		case i < 3 && len(res.Removed) != 0:
			t.Fatalf("run %d removed %v with %d copies of 3 kept", i, res.Removed, i+1)
		case i == 3 && !slices.Equal(res.Removed, made[:1]):
			t.Fatalf("run 4 removed %v, want the oldest %v", res.Removed, made[:1])
		}
		at.Advance(24 * time.Hour)
	}
	entries, err := os.ReadDir(out)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	wantNames := []string{"compass-20261204T030000Z.db", "compass-20261205T030000Z.db", "compass-20261206T030000Z.db", "compass-notes.db"}
	if !slices.Equal(names, wantNames) {
		t.Fatalf("the directory holds %v, want %v", names, wantNames)
	}
	for _, f := range made[1:] {
		fi, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s has mode %v, want 0600", f, fi.Mode().Perm())
		}
	}
	// The newest copy is a backup of the data: it holds the tokens.
	cp, err := store.OpenCurrent(t.Context(), "sqlite://"+made[3])
	if err != nil {
		t.Fatal(err)
	}
	defer cp.Close()
	got, err := cp.ListTokens(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want.tokens) {
		t.Fatalf("the copy lists %d tokens, want %d", len(got), len(want.tokens))
	}
}

func TestBackupToDirRefuses(t *testing.T) {
	dir := t.TempDir()
	st, _, url, _ := sqliteInDataDir(t, dir)
	defer st.Close()
	at := storetest.NewClock(time.Date(2026, 12, 3, 3, 0, 0, 0, time.UTC))
	file := filepath.Join(dir, "a-file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, dir string
		keep      int
		want      string
	}{
		{"keep 0", dir, 0, "store: backup: keep 0 is not from 1 to 1000"},
		{"keep over the limit", dir, 1001, "store: backup: keep 1001 is not from 1 to 1000"},
		{"no directory", filepath.Join(dir, "missing"), 3, "no such file or directory"},
		{"a file, not a directory", file, 3, "store: backup: " + file + " is not a directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := store.BackupToDir(t.Context(), url, tc.dir, tc.keep, store.WithClock(at.Now))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("BackupToDir = %v, want %q", err, tc.want)
			}
		})
	}
	// Two runs in one second: the second never overwrites the first.
	if _, err := store.BackupToDir(t.Context(), url, dir, 3, store.WithClock(at.Now)); err != nil {
		t.Fatal(err)
	}
	if _, err := store.BackupToDir(t.Context(), url, dir, 3, store.WithClock(at.Now)); err == nil || !strings.Contains(err.Error(), "file exists") {
		t.Fatalf("a second backup in the same second = %v, want file exists", err)
	}
}
