package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// testNameRE matches a Go test, benchmark, fuzz target or example named in a
// document's code span, with an optional package path before it
// (`runner.TestX`, `cmd/compass-server.TestY`) and subtest after it.
var testNameRE = regexp.MustCompile(`\b(?:Test|Benchmark|Fuzz|Example)[A-Z_][A-Za-z0-9_]*`)

// codeSpanRE matches an inline code span.
var codeSpanRE = regexp.MustCompile("`[^`\n]+`")

// testFuncRE matches the declaration of a test, benchmark, fuzz target or
// example.
var testFuncRE = regexp.MustCompile(`(?m)^func ((?:Test|Benchmark|Fuzz|Example)[A-Za-z0-9_]*)\(`)

// Every test the documents name in a code span exists in the repository: a
// renamed or moved test leaves no reference behind that a reader cannot
// follow.
func TestNamedTestsExist(t *testing.T) {
	root := ".."
	defined := map[string]bool{}
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && p != root && strings.HasPrefix(d.Name(), ".") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, m := range testFuncRE.FindAllSubmatch(src, -1) {
			defined[string(m[1])] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !defined["TestNamedTestsExist"] {
		t.Fatal("the walk found no tests")
	}
	for _, f := range markdownFiles(t, root) {
		var missing []string
		for _, span := range codeSpans(t, f) {
			for _, name := range testNameRE.FindAllString(span, -1) {
				if !defined[name] && !slices.Contains(missing, name) {
					missing = append(missing, name)
				}
			}
		}
		for _, name := range missing {
			t.Errorf("%s names %s, which no _test.go file declares", f, name)
		}
	}
}

// codeSpans are the code spans of the Markdown file f outside its fenced
// blocks: the places a document names a path or a test.
func codeSpans(t *testing.T, f string) []string {
	t.Helper()
	b, err := os.ReadFile(f)
	if err != nil {
		t.Fatal(err)
	}
	return codeSpanRE.FindAllString(stripFences(string(b)), -1)
}

// stripFences drops fenced code blocks, whose content is commands and
// output, not references.
func stripFences(s string) string {
	var b strings.Builder
	in := false
	for line := range strings.Lines(s) {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			in = !in
			continue
		}
		if !in {
			b.WriteString(line)
		}
	}
	return b.String()
}
