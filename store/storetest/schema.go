package storetest

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/compass-runner/identity/store"
	"github.com/compass-runner/identity/verifier"
)

func testReopen(t *testing.T, b Backend) {
	url := b.NewURL(t)
	clock := NewClock(start)
	ctx := t.Context()
	st, err := store.Open(ctx, url, store.WithClock(clock.Now))
	if err != nil {
		t.Fatalf("Open #1: %v", err)
	}
	version, err := st.SchemaVersion(ctx)
	if err != nil {
		t.Fatalf("SchemaVersion: %v", err)
	}
	if version < 1 {
		t.Fatalf("SchemaVersion = %d after Open, want at least 1", version)
	}
	tenant := bootstrap(t, st)
	tok, _ := mustMint(t, st, verifier.SubjectRunner, "r1")
	if err := st.Close(); err != nil {
		t.Fatalf("Close #1: %v", err)
	}
	for i := 2; i <= 3; i++ {
		clock.Advance(time.Hour)
		st := open(t, url, clock)
		if v, err := st.SchemaVersion(ctx); err != nil || v != version {
			t.Fatalf("reopen #%d: SchemaVersion = %d, %v; want %d", i, v, err, version)
		}
		if got := bootstrap(t, st); got != tenant {
			t.Fatalf("reopen #%d: bootstrap tenant %q, want %q", i, got, tenant)
		}
		if _, err := verifier.NewResolver(nil, st).Resolve(ctx, tok, verifier.SubjectRunner); err != nil {
			t.Fatalf("reopen #%d: Resolve(token minted before): %v", i, err)
		}
	}
	if n := b.QueryInt(t, url, "SELECT count(*) FROM schema_migrations"); n != int64(version) {
		t.Fatalf("schema_migrations has %d rows, want %d (one per migration, applied once)", n, version)
	}
	if n := b.QueryInt(t, url, "SELECT count(*) FROM tenants"); n != 1 {
		t.Fatalf("tenants has %d rows after reopening, want 1", n)
	}
}

func testSchemaTooNew(t *testing.T, b Backend) {
	url := b.NewURL(t)
	clock := NewClock(start)
	st := open(t, url, clock)
	version, err := st.SchemaVersion(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	b.Exec(t, url, fmt.Sprintf("INSERT INTO schema_migrations (version, name, applied_at) VALUES (%d, 'from_the_future', '2030-01-01T00:00:00.000000Z')", version+1))
	st2, err := store.Open(t.Context(), url, store.WithClock(clock.Now))
	if !errors.Is(err, store.ErrSchemaTooNew) || !strings.Contains(err.Error(), fmt.Sprintf("at schema version %d, newer than the %d", version+1, version)) {
		if err == nil {
			_ = st2.Close()
		}
		t.Fatalf("Open on a newer schema: error = %v, want ErrSchemaTooNew", err)
	}
}

func testMigrateThenOpenCurrent(t *testing.T, b Backend) {
	url := b.NewURL(t)
	ctx := t.Context()
	wanted := store.SchemaVersionWanted()
	st, err := store.OpenCurrent(ctx, url)
	switch b.Name {
	case "sqlite":
		if !errors.Is(err, store.ErrNoDatabase) {
			t.Fatalf("OpenCurrent(no file) error = %v, want ErrNoDatabase", err)
		}
	default:
		want := fmt.Sprintf("store: the %s database has no schema yet (version 0) and this binary wants %d: run compass-server migrate", b.Name, wanted)
		if !errors.Is(err, store.ErrSchemaBehind) || err.Error() != want {
			t.Fatalf("OpenCurrent(empty database) error = %v, want %q", err, want)
		}
	}
	if st != nil {
		t.Fatal("OpenCurrent returned a store with an error")
	}

	res, err := store.Migrate(ctx, url)
	if err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	if res != (store.MigrateResult{Backend: b.Name, From: 0, To: wanted}) {
		t.Fatalf("Migrate = %+v, want from 0 to %d", res, wanted)
	}
	res, err = store.Migrate(ctx, url)
	if err != nil || res != (store.MigrateResult{Backend: b.Name, From: wanted, To: wanted}) {
		t.Fatalf("Migrate again = %+v, %v; want from %d to %d", res, err, wanted, wanted)
	}
	clock := NewClock(start)
	st, err = store.OpenCurrent(ctx, url, store.WithClock(clock.Now))
	if err != nil {
		t.Fatalf("OpenCurrent after Migrate: %v", err)
	}
	t.Cleanup(func() { _ = st.Close() })
	if v, err := st.SchemaVersion(ctx); err != nil || v != wanted {
		t.Fatalf("SchemaVersion = %d, %v; want %d", v, err, wanted)
	}
	tok, _ := mustMint(t, st, verifier.SubjectRunner, "r1")
	if _, err := verifier.NewResolver(nil, st).Resolve(ctx, tok, verifier.SubjectRunner); err != nil {
		t.Fatalf("Resolve on a store from OpenCurrent: %v", err)
	}
	if n := b.QueryInt(t, url, "SELECT count(*) FROM schema_migrations"); n != int64(wanted) {
		t.Fatalf("schema_migrations has %d rows, want %d", n, wanted)
	}
}

func testOpenCurrentRefuses(t *testing.T, b Backend) {
	url := b.NewURL(t)
	ctx := t.Context()
	wanted := store.SchemaVersionWanted()
	if _, err := store.Migrate(ctx, url); err != nil {
		t.Fatal(err)
	}
	// Behind: the last migration's record removed (OpenCurrent reads the
	// version only; the upgrade itself is TestUpgradeKeepsTokensAndRunners).
	b.Exec(t, url, fmt.Sprintf("DELETE FROM schema_migrations WHERE version = %d", wanted))
	st, err := store.OpenCurrent(ctx, url)
	want := fmt.Sprintf("store: the %s database is at schema version %d and this binary wants %d: run compass-server migrate", b.Name, wanted-1, wanted)
	var se *store.SchemaError
	if !errors.Is(err, store.ErrSchemaBehind) || errors.Is(err, store.ErrSchemaTooNew) || err.Error() != want ||
		!errors.As(err, &se) || *se != (store.SchemaError{Backend: b.Name, Found: wanted - 1, Wanted: wanted}) {
		t.Fatalf("OpenCurrent(behind) error = %v, want %q", err, want)
	}
	if st != nil {
		t.Fatal("OpenCurrent returned a store with an error")
	}
	if n := b.QueryInt(t, url, "SELECT count(*) FROM schema_migrations"); n != int64(wanted-1) {
		t.Fatalf("OpenCurrent changed schema_migrations: %d rows, want %d", n, wanted-1)
	}

	// Ahead: a newer binary's migration recorded.
	b.Exec(t, url, fmt.Sprintf("INSERT INTO schema_migrations (version, name, applied_at) VALUES (%d, '%04d_x', '2030-01-01T00:00:00.000000Z')", wanted, wanted))
	b.Exec(t, url, fmt.Sprintf("INSERT INTO schema_migrations (version, name, applied_at) VALUES (%d, 'from_the_future', '2030-01-01T00:00:00.000000Z')", wanted+1))
	want = fmt.Sprintf("store: the %s database is at schema version %d, newer than the %d this binary wants: a newer release migrated it; upgrade this binary", b.Name, wanted+1, wanted)
	for name, openFn := range map[string]func() (store.Store, error){
		"OpenCurrent": func() (store.Store, error) { return store.OpenCurrent(ctx, url) },
		"Open":        func() (store.Store, error) { return store.Open(ctx, url) },
		"Migrate": func() (store.Store, error) {
			_, err := store.Migrate(ctx, url)
			return nil, err
		},
	} {
		st, err := openFn()
		if !errors.Is(err, store.ErrSchemaTooNew) || errors.Is(err, store.ErrSchemaBehind) || err.Error() != want {
			t.Fatalf("%s(ahead) error = %v, want %q", name, err, want)
		}
		if st != nil {
			t.Fatalf("%s returned a store with an error", name)
		}
	}
	if n := b.QueryInt(t, url, "SELECT count(*) FROM schema_migrations"); n != int64(wanted+1) {
		t.Fatalf("a refused open changed schema_migrations: %d rows, want %d", n, wanted+1)
	}
}

// concurrentOpens is how many Servers race to migrate one new database.
const concurrentOpens = 4

func testConcurrentOpen(t *testing.T, b Backend) {
	url := b.NewURL(t)
	clock := NewClock(start)
	ctx := t.Context()
	stores := make([]store.Store, concurrentOpens)
	errs := make([]error, concurrentOpens)
	var wg sync.WaitGroup
	for i := range concurrentOpens {
		wg.Go(func() { stores[i], errs[i] = store.Open(ctx, url, store.WithClock(clock.Now)) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("concurrent Open #%d: %v", i, err)
			continue
		}
		t.Cleanup(func() { _ = stores[i].Close() })
	}
	if t.Failed() {
		t.FailNow()
	}
	version, err := stores[0].SchemaVersion(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n := b.QueryInt(t, url, "SELECT count(*) FROM schema_migrations"); n != int64(version) {
		t.Fatalf("schema_migrations has %d rows after %d concurrent Opens, want %d", n, concurrentOpens, version)
	}
	if n := b.QueryInt(t, url, "SELECT count(*) FROM tenants"); n != 1 {
		t.Fatalf("tenants has %d rows after %d concurrent Opens, want 1", n, concurrentOpens)
	}
}
