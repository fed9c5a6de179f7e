package runner

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// ErrMountOverToken: a --mount would expose the token directory to a guest.
// An agent that can read the Runner's token can enroll as the node (DL-440
// threat model), so the host path may not be the token directory, inside it,
// or an ancestor of it, however it is spelled.
var ErrMountOverToken = errors.New("runner: mount exposes the token directory")

// ErrBadMount: a --mount value is not host:guest with absolute paths.
var ErrBadMount = errors.New("runner: invalid --mount")

// Mount is one --mount host:guest.
type Mount struct {
	Host, Guest string
}

func (m Mount) String() string { return m.Host + ":" + m.Guest }

// ParseMount parses "host:guest"; both paths must be absolute.
func ParseMount(s string) (Mount, error) {
	host, guest, ok := strings.Cut(s, ":")
	if !ok || host == "" || guest == "" {
		return Mount{}, fmt.Errorf("%w %q: want host:guest", ErrBadMount, s)
	}
	if !filepath.IsAbs(host) || !filepath.IsAbs(guest) {
		return Mount{}, fmt.Errorf("%w %q: both paths must be absolute", ErrBadMount, s)
	}
	return Mount{Host: filepath.Clean(host), Guest: filepath.Clean(guest)}, nil
}

// CheckMounts refuses every mount whose host path is the directory of
// tokenFile, inside it or an ancestor of it. Paths are compared both cleaned
// and with symlinks resolved (the kubelet's projected volume is itself a tree
// of symlinks, and /var/run is often a link to /run), so a symlink to the
// token directory is refused too. With no token file there is nothing to
// guard.
func CheckMounts(mounts []Mount, tokenFile string) error {
	if tokenFile == "" {
		return nil
	}
	abs, err := filepath.Abs(tokenFile)
	if err != nil {
		return fmt.Errorf("runner: token file path: %w", err)
	}
	dir := filepath.Dir(abs)
	protected := []string{dir, resolve(dir)}
	if real, err := filepath.EvalSymlinks(abs); err == nil {
		protected = append(protected, filepath.Dir(real))
	}
	var errs []error
	for _, m := range mounts {
		host, err := filepath.Abs(m.Host)
		if err != nil {
			errs = append(errs, fmt.Errorf("%w %s: %w", ErrBadMount, m, err))
			continue
		}
		if rel := overlaps([]string{host, resolve(host)}, protected); rel != "" {
			errs = append(errs, fmt.Errorf("%w: --mount %s: host path %s %s token directory %s", ErrMountOverToken, m, m.Host, rel, dir))
		}
	}
	return errors.Join(errs...)
}

// overlaps reports how any of paths relates to any of protected: "is the",
// "is inside the", "is an ancestor of the", or "" for no overlap.
func overlaps(paths, protected []string) string {
	for _, p := range paths {
		for _, q := range protected {
			switch {
			case p == q:
				return "is the"
			case within(p, q):
				return "is inside the"
			case within(q, p):
				return "is an ancestor of the"
			}
		}
	}
	return ""
}

// within reports whether p is strictly below dir (both clean and absolute).
func within(p, dir string) bool {
	if dir == string(filepath.Separator) {
		return p != dir
	}
	return strings.HasPrefix(p, dir+string(filepath.Separator))
}

// resolve returns p with symlinks resolved for its longest existing prefix,
// so a not-yet-existing path under a symlink is still resolved.
func resolve(p string) string {
	p = filepath.Clean(p)
	var rest []string
	for cur := p; ; {
		if real, err := filepath.EvalSymlinks(cur); err == nil {
			return filepath.Join(append([]string{real}, rest...)...)
		} else if !errors.Is(err, os.ErrNotExist) {
			return p
		}
		parent := filepath.Dir(cur)
		if parent == cur {
			return p
		}
		rest = append([]string{filepath.Base(cur)}, rest...)
		cur = parent
	}
}
