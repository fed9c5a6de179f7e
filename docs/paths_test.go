package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// repoPathRE matches a code span that names a path in the repository: it
// starts with one of the repository's top-level directories and goes on with
// path segments, optionally ending in "/" (a directory) or with a file name.
// A span with a space, a glob or a placeholder (<...>) is a command or a
// pattern, not a path.
var repoPathRE = regexp.MustCompile(`^(?:callout|cmd|deploy|docs|door|gen|internal|kick|kubeissuer|podwatch|proto|runner|server|store|subjects|test|tokenreview|tools|verifier)/[A-Za-z0-9_./-]*$`)

// testInPathRE finds a test named after a package path (`test/door.TestX`).
var testInPathRE = regexp.MustCompile(`\.(?:Test|Benchmark|Fuzz|Example)`)

// Every repository path the documents name in a code span exists: a file or
// package that moved leaves no reference behind that a reader cannot follow.
func TestNamedPathsExist(t *testing.T) {
	root := ".."
	checked := 0
	for _, f := range markdownFiles(t, root) {
		var missing []string
		for _, span := range codeSpans(t, f) {
			p := strings.Trim(span, "`")
			if !repoPathRE.MatchString(p) || strings.Contains(p, "...") {
				continue
			}
			// pkg.TestName: the package must exist (TestNamedTestsExist
			// checks the test).
			if i := testInPathRE.FindStringIndex(p); i != nil {
				p = p[:i[0]]
			}
			checked++
			if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(p))); err != nil && !slices.Contains(missing, p) {
				missing = append(missing, p)
			}
		}
		for _, p := range missing {
			t.Errorf("%s names %s, which does not exist", f, p)
		}
	}
	t.Logf("%d paths checked", checked)
	if checked < 50 {
		t.Fatalf("checked %d paths: the documents name far more", checked)
	}
}
