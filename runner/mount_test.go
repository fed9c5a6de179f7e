package runner

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// projectedVolume lays out a token directory the way the kubelet's atomic
// writer does: dir/..<ts>/token, dir/..data -> ..<ts>, dir/token -> ..data/token.
func projectedVolume(t *testing.T) (root, dir, tokenFile string) {
	t.Helper()
	root = t.TempDir()
	if r, err := filepath.EvalSymlinks(root); err == nil {
		root = r
	}
	dir = filepath.Join(root, "var", "run", "secrets", "compass", "runner")
	ts := filepath.Join(dir, "..2026_11_30_00_00_00.123")
	if err := os.MkdirAll(ts, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(ts, "token"), "t")
	if err := os.Symlink("..2026_11_30_00_00_00.123", filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join("..data", "token"), filepath.Join(dir, "token")); err != nil {
		t.Fatal(err)
	}
	return root, dir, filepath.Join(dir, "token")
}

func TestMountGuard(t *testing.T) {
	root, dir, tokenFile := projectedVolume(t)
	other := filepath.Join(root, "work")
	if err := os.MkdirAll(other, 0o755); err != nil {
		t.Fatal(err)
	}
	link := func(name, target string) string {
		p := filepath.Join(root, name)
		if err := os.Symlink(target, p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	linkToDir := link("to-token-dir", dir)
	linkToParent := link("to-secrets", filepath.Dir(dir))
	linkToOther := link("to-work", other)
	cases := []struct {
		name string
		host string
		want error
	}{
		{"the token directory", dir, ErrMountOverToken},
		{"the token directory with a trailing slash", dir + "/", ErrMountOverToken},
		{"the token directory spelled with ..", filepath.Join(dir, "..", "runner") + "/./", ErrMountOverToken},
		{"the token file itself", tokenFile, ErrMountOverToken},
		{"inside the token directory (the ..data link)", filepath.Join(dir, "..data"), ErrMountOverToken},
		{"inside the token directory (not existing yet)", filepath.Join(dir, "new", "sub"), ErrMountOverToken},
		{"an ancestor of the token directory", filepath.Dir(dir), ErrMountOverToken},
		{"a far ancestor", root, ErrMountOverToken},
		{"the filesystem root", "/", ErrMountOverToken},
		{"a symlink to the token directory", linkToDir, ErrMountOverToken},
		{"a path under a symlink to the token directory", filepath.Join(linkToDir, "..data"), ErrMountOverToken},
		{"a not-yet-existing path under a symlink to the token directory", filepath.Join(linkToDir, "x"), ErrMountOverToken},
		{"a symlink to an ancestor", linkToParent, ErrMountOverToken},
		{"a sibling with a common name prefix", dir + "-other", nil},
		{"an unrelated directory", other, nil},
		{"a symlink to an unrelated directory", linkToOther, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckMounts([]Mount{{Host: tc.host, Guest: "/mnt"}}, tokenFile)
			if !errors.Is(err, tc.want) {
				t.Fatalf("CheckMounts(%s) = %v, want %v", tc.host, err, tc.want)
			}
		})
	}
}

func TestMountGuardThroughSymlinkedTokenPath(t *testing.T) {
	// The token file is named through a symlink (as /var/run -> /run): a mount
	// of the real directory is still refused, and so is the spelled one.
	root, dir, _ := projectedVolume(t)
	alias := filepath.Join(root, "alias")
	if err := os.Symlink(filepath.Join(root, "var"), alias); err != nil {
		t.Fatal(err)
	}
	tokenViaAlias := filepath.Join(alias, "run", "secrets", "compass", "runner", "token")
	for _, host := range []string{dir, filepath.Dir(tokenViaAlias), filepath.Join(root, "var", "run")} {
		if err := CheckMounts([]Mount{{Host: host, Guest: "/mnt"}}, tokenViaAlias); !errors.Is(err, ErrMountOverToken) {
			t.Fatalf("CheckMounts(%s) = %v, want ErrMountOverToken", host, err)
		}
	}
}

func TestMountGuardWithoutTokenFile(t *testing.T) {
	if err := CheckMounts([]Mount{{Host: "/", Guest: "/mnt"}}, ""); err != nil {
		t.Fatalf("a static token has no directory to guard, got %v", err)
	}
}

func TestMountGuardReportsEveryBadMount(t *testing.T) {
	_, dir, tokenFile := projectedVolume(t)
	err := CheckMounts([]Mount{{Host: dir, Guest: "/a"}, {Host: t.TempDir(), Guest: "/b"}, {Host: filepath.Dir(dir), Guest: "/c"}}, tokenFile)
	if !errors.Is(err, ErrMountOverToken) {
		t.Fatalf("err = %v", err)
	}
	var joined interface{ Unwrap() []error }
	if !errors.As(err, &joined) || len(joined.Unwrap()) != 2 {
		t.Fatalf("want exactly the two bad mounts reported, got %v", err)
	}
}

func TestParseMount(t *testing.T) {
	cases := []struct {
		in   string
		want Mount
		err  error
	}{
		{"/data:/mnt/data", Mount{"/data", "/mnt/data"}, nil},
		{"/data/../x/:/mnt/", Mount{"/x", "/mnt"}, nil},
		{"/data", Mount{}, ErrBadMount},
		{"data:/mnt", Mount{}, ErrBadMount},
		{"/data:mnt", Mount{}, ErrBadMount},
		{":/mnt", Mount{}, ErrBadMount},
	}
	for _, tc := range cases {
		got, err := ParseMount(tc.in)
		if !errors.Is(err, tc.err) || got != tc.want {
			t.Fatalf("ParseMount(%q) = %v, %v; want %v, %v", tc.in, got, err, tc.want, tc.err)
		}
	}
}
