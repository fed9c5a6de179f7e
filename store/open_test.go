package store_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/compass-runner/identity/internal/lib/testutil"
	"github.com/compass-runner/identity/store"
)

func TestOpenPicksSQLite(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		url  string
		file string // where the database must appear
	}{
		{"sqlite URL, absolute path", "sqlite://" + filepath.Join(dir, "a", "compass.db"), filepath.Join(dir, "a", "compass.db")},
		{"sqlite URL, relative path", "sqlite:rel/compass.db", filepath.Join(dir, "rel", "compass.db")},
		{"plain path", filepath.Join(dir, "b", "c", "compass.db"), filepath.Join(dir, "b", "c", "compass.db")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Chdir(dir)
			st, err := store.Open(t.Context(), tc.url)
			if err != nil {
				t.Fatalf("Open(%q): %v", tc.url, err)
			}
			t.Cleanup(func() { _ = st.Close() })
			if got := st.Backend(); got != "sqlite" {
				t.Fatalf("Backend() = %q, want sqlite", got)
			}
			fi, err := os.Stat(tc.file)
			if err != nil {
				t.Fatalf("database file: %v", err)
			}
			if perm := fi.Mode().Perm(); perm != 0o600 {
				t.Fatalf("database file mode %v, want 0600", perm)
			}
			di, err := os.Stat(filepath.Dir(tc.file))
			if err != nil {
				t.Fatal(err)
			}
			if perm := di.Mode().Perm(); perm != 0o700 {
				t.Fatalf("data directory mode %v, want 0700", perm)
			}
		})
	}
}

func TestOpenRefusesBadURLs(t *testing.T) {
	for _, tc := range []struct {
		name string
		url  string
	}{
		{"empty", ""},
		{"empty sqlite path", "sqlite://"},
		{"unknown scheme", "mysql://user@localhost/db"},
		{"in-memory sqlite", "sqlite::memory:"},
		{"sqlite URL parameters", "sqlite:///tmp/x.db?mode=ro"},
		{"malformed postgres URL", "postgres://user:hunter2-secret@localhost:notaport/db"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, err := store.Open(t.Context(), tc.url)
			if !errors.Is(err, store.ErrInvalidURL) {
				if err == nil {
					_ = st.Close()
				}
				t.Fatalf("Open(%q) error = %v, want ErrInvalidURL", tc.url, err)
			}
			if strings.Contains(err.Error(), "hunter2-secret") {
				t.Fatalf("Open error shows the password: %v", err)
			}
		})
	}
}

// A server that cannot be reached fails Open, without the password in the error.
func TestOpenPostgresUnreachableHidesPassword(t *testing.T) {
	addr := testutil.FreeAddr(t) // nothing listens there now
	url := "postgres://compass:hunter2-secret@" + addr + "/compass?sslmode=disable&connect_timeout=5"
	st, err := store.Open(t.Context(), url)
	if err == nil {
		_ = st.Close()
		t.Fatal("Open on a closed port succeeded")
	}
	if !strings.HasPrefix(err.Error(), "store: ") {
		t.Fatalf("error %q is not prefixed with the package name", err)
	}
	if strings.Contains(err.Error(), "hunter2-secret") {
		t.Fatalf("Open error shows the password: %v", err)
	}
}
