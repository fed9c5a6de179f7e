// Package docs holds the project's documentation; its tests check that
// every relative link in README.md, docs/ and the other guides resolves to a
// file (and heading) inside the repository, and that every test they name
// exists.
package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// linkRE matches an inline Markdown link or image target: [text](target)
// or [text](target "title").
var linkRE = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)

// pathSpanRE matches a code span holding a relative path that climbs out
// of its directory, such as `../shared/design/overview.md`.
var pathSpanRE = regexp.MustCompile("`(\\.\\./[^`\\s]+)`")

// headingRE matches an ATX heading.
var headingRE = regexp.MustCompile(`(?m)^#{1,6}\s+(.+?)\s*#*\s*$`)

// fenceRE matches a fenced code block, whose content is not Markdown.
var fenceRE = regexp.MustCompile("(?ms)^\\s*```.*?^\\s*```")

// slug is the anchor a heading gets: lowercase, punctuation dropped but for
// hyphens and underscores, spaces to hyphens.
func slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127:
			b.WriteRune(r)
		}
	}
	return b.String()
}

func anchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	text := fenceRE.ReplaceAllString(string(data), "")
	for _, m := range headingRE.FindAllStringSubmatch(text, -1) {
		h := strings.NewReplacer("`", "", "*", "").Replace(m[1])
		s := slug(h)
		for n := 1; out[s]; n++ { // GitHub numbers repeated headings
			s = slug(h) + "-" + string(rune('0'+n))
		}
		out[s] = true
	}
	return out
}

// markdownFiles are the documents users read: README.md, everything under
// docs/, and the READMEs beside the deploy material.
func markdownFiles(t *testing.T, root string) []string {
	t.Helper()
	var files []string
	for _, dir := range []string{".", "docs", "deploy"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(p string, d os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && p != filepath.Join(root, dir) && (dir == "." || strings.HasPrefix(d.Name(), ".")) {
				return filepath.SkipDir
			}
			if !d.IsDir() && strings.HasSuffix(p, ".md") {
				files = append(files, p)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return files
}

// Every relative link in the documents resolves: its file exists inside the
// repository, and its #anchor names a heading of that file. No link leaves
// the repository, by a relative path or by a URL.
func TestRelativeLinksResolve(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	files := markdownFiles(t, root)
	if len(files) < 5 {
		t.Fatalf("found only %d Markdown files under %s", len(files), root)
	}
	checked := 0
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, f)
		text := fenceRE.ReplaceAllString(string(data), "")
		for _, m := range pathSpanRE.FindAllStringSubmatch(text, -1) {
			dest := filepath.Join(filepath.Dir(f), filepath.FromSlash(m[1]))
			if r, err := filepath.Rel(root, dest); err != nil || strings.HasPrefix(r, "..") {
				t.Errorf("%s: path %s points out of the repository", rel, m[1])
			} else if _, err := os.Stat(dest); err != nil {
				t.Errorf("%s: path %s: %v", rel, m[1], err)
			}
		}
		for _, m := range linkRE.FindAllStringSubmatch(text, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				t.Errorf("%s: link %s leaves the repository", rel, target)
				continue
			}
			file, anchor, _ := strings.Cut(target, "#")
			dest := f
			if file != "" {
				dest = filepath.Join(filepath.Dir(f), filepath.FromSlash(file))
			}
			if r, err := filepath.Rel(root, dest); err != nil || strings.HasPrefix(r, "..") {
				t.Errorf("%s: link %s leaves the repository", rel, target)
				continue
			}
			fi, err := os.Stat(dest)
			if err != nil {
				t.Errorf("%s: link %s: %v", rel, target, err)
				continue
			}
			if anchor != "" {
				if fi.IsDir() || !strings.HasSuffix(dest, ".md") {
					t.Errorf("%s: link %s: an anchor into something that is not a Markdown file", rel, target)
				} else if !anchors(t, dest)[anchor] {
					t.Errorf("%s: link %s: no heading with that anchor", rel, target)
				}
			}
			checked++
		}
	}
	if checked == 0 {
		t.Fatal("no links checked")
	}
	t.Logf("%d links in %d files resolve", checked, len(files))
}

func TestSlug(t *testing.T) {
	for in, want := range map[string]string{
		"The cluster file":                      "the-cluster-file",
		"NATS as a cluster: clients, node loss": "nats-as-a-cluster-clients-node-loss",
		"13a. A stolen node":                    "13a-a-stolen-node",
		"DL-440's threats":                      "dl-440s-threats",
	} {
		if got := slug(in); got != want {
			t.Errorf("slug(%q) = %q, want %q", in, got, want)
		}
	}
}
