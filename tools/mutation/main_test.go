package main

import (
	"bytes"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A gremlins v0.6.0 JSON report, trimmed to one file.
const sample = `{"go_module":"example.com/m","files":[{"file_name":"a.go","mutations":[
{"type":"CONDITIONALS_NEGATION","status":"KILLED","line":3,"column":7},
{"type":"CONDITIONALS_BOUNDARY","status":"LIVED","line":9,"column":12},
{"type":"ARITHMETIC_BASE","status":"NOT COVERED","line":2,"column":5},
{"type":"INVERT_LOGICAL","status":"TIMED OUT","line":4,"column":1},
{"type":"ARITHMETIC_BASE","status":"NOT VIABLE","line":5,"column":1},
{"type":"CONDITIONALS_NEGATION","status":"KILLED","line":1,"column":2}]}],
"test_efficacy":66.6,"mutations_coverage":75,"mutants_total":4,"mutants_killed":2,"mutants_lived":1,
"mutants_not_viable":1,"mutants_not_covered":1,"elapsed_time":1.5}`

func TestParseCountsEveryStatus(t *testing.T) {
	s, err := parse(strings.NewReader(sample), "pkg")
	if err != nil {
		t.Fatal(err)
	}
	got := [5]int{s.Killed, s.Lived, s.NotCovered, s.TimedOut, s.NotViable}
	if want := [5]int{2, 1, 1, 1, 1}; got != want {
		t.Errorf("killed, lived, not covered, timed out, not viable = %v, want %v", got, want)
	}
	if first := s.Mutants[0]; first.File != "pkg/a.go" || first.Line != 1 {
		t.Errorf("mutants not sorted by position or not prefixed with the package: first is %+v", first)
	}
	if _, err := parse(strings.NewReader(`{"files":[{"file_name":"a.go","mutations":[{"status":"RUNNABLE"}]}]}`), "pkg"); err == nil {
		t.Error("an unknown status (a dry run's RUNNABLE) was accepted")
	}
}

func TestFiguresAndTargets(t *testing.T) {
	tests := []struct {
		name                       string
		s                          summary
		efficacy, coverage         float64
		met                        bool
		efficacyText, coverageText string
	}{
		{"exactly at target", summary{Target: 90, Killed: 9, Lived: 1}, 90, 100, true, "90.0%", "100.0%"},
		{"just under is a miss and reads as one", summary{Target: 90, Killed: 8999, Lived: 1001}, 89.99, 100, false, "89.9%", "100.0%"},
		{"coverage misses", summary{Target: 85, Killed: 10, NotCovered: 2}, 100, 100 * 10.0 / 12, false, "100.0%", "83.3%"},
		{"timed out and not viable count in neither", summary{Target: 90, Killed: 9, Lived: 1, TimedOut: 5, NotViable: 5}, 90, 100, true, "90.0%", "100.0%"},
		{"nothing to mutate", summary{Target: 90}, 100, 100, true, "100.0%", "100.0%"},
		{"nothing ran, all uncovered", summary{Target: 90, NotCovered: 3}, 0, 0, false, "0.0%", "0.0%"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.s.Efficacy(); got != tt.efficacy {
				t.Errorf("Efficacy = %v, want %v", got, tt.efficacy)
			}
			if got := tt.s.Coverage(); got != tt.coverage {
				t.Errorf("Coverage = %v, want %v", got, tt.coverage)
			}
			if got := tt.s.Met(); got != tt.met {
				t.Errorf("Met = %v, want %v", got, tt.met)
			}
			if got := pct(tt.s.Efficacy()); got != tt.efficacyText {
				t.Errorf("pct(efficacy) = %q, want %q", got, tt.efficacyText)
			}
			if got := pct(tt.s.Coverage()); got != tt.coverageText {
				t.Errorf("pct(coverage) = %q, want %q", got, tt.coverageText)
			}
		})
	}
}

func TestRunReportsAndFails(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "pkg.json"), []byte(sample), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "pkg.wall"), []byte("125\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		args     []string
		code     int
		contains []string
	}{
		{"target missed", []string{"-source=false", "-dir", dir, "pkg=90"}, 1, []string{
			"66.6%", "75.0%", "2m05s", "MISSED",
			"LIVED (1):\n  pkg/a.go:9:12 CONDITIONALS_BOUNDARY\n",
			"NOT COVERED (1):\n  pkg/a.go:2:5 ARITHMETIC_BASE\n",
			"TIMED OUT (1):\n  pkg/a.go:4:1 INVERT_LOGICAL\n",
		}},
		{"target met", []string{"-source=false", "-dir", dir, "pkg=60"}, 0, []string{"66.6%", " met"}},
		{"fractional target printed as given", []string{"-source=false", "-dir", dir, "pkg=66.7"}, 1, []string{"66.6%", "66.7%", "MISSED"}},
		{"missing results fail", []string{"-dir", dir, "pkg=60", "other=60"}, 1, []string{"NO RESULTS", "other: no results"}},
		{"no packages", []string{"-dir", dir}, 2, nil},
		{"bad target", []string{"-dir", dir, "pkg=ninety"}, 2, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := run(tt.args, &stdout, &stderr); code != tt.code {
				t.Errorf("exit status %d, want %d; stderr: %s", code, tt.code, stderr.String())
			}
			for _, want := range tt.contains {
				if !strings.Contains(stdout.String(), want) {
					t.Errorf("output lacks %q:\n%s", want, stdout.String())
				}
			}
		})
	}
}

const switchSrc = `package p

const Limit = 1 << 10

var table = map[string]int{"a": 1 + 1}

var hook = func(n int) bool { return n > 0 }

func F(r rune) int {
	n := 0
	switch {
	case r == '.' || r == '*':
		n = 1
	case r > 'z':
		n = 2
	}
	return n
}

func G(r rune) int {
	switch r {
	case 'a', 'b':
		return 1
	}
	return 0
}
`

func TestUncountedAddsCaseConditionsAndPackageValues(t *testing.T) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "p.go", switchSrc, 0)
	if err != nil {
		t.Fatal(err)
	}
	// F's body (its switch keyword on line 11) ran; G's did not.
	blocks := []block{
		{startLine: 9, startCol: 21, endLine: 11, endCol: 10, count: 3},
		{startLine: 20, startCol: 21, endLine: 21, endCol: 12, count: 0},
	}
	got := uncounted(fset, f, blocks)
	want := []block{
		{3, 15, 3, 22, 1},  // 1 << 10
		{5, 13, 5, 39, 1},  // the map literal
		{12, 7, 12, 27, 1}, // r == '.' || r == '*'
		{14, 7, 14, 14, 1}, // r > 'z'
	}
	if len(got) != len(want) {
		t.Fatalf("uncounted = %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("block %d = %v, want %v", i, got[i], want[i])
		}
	}
}

func TestFixProfile(t *testing.T) {
	root := t.TempDir()
	write := func(name, text string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module example.com/m\n\ngo 1.26\n")
	write("p/p.go", switchSrc)
	// Files of the package with no function: not in the profile.
	write("p/limits.go", "package p\n\nimport \"time\"\n\nconst Wait = 5 * time.Second\n")
	write("p/limits_other.go", "//go:build ignore\n\npackage p\n\nconst Other = 2 * 3\n")
	write("p/limits_test.go", "package p\n\nconst inTest = 2 * 3\n")
	write("p/sub/s.go", "package sub\n\nconst Sub = 2 * 3\n")
	const profile = "mode: set\nexample.com/m/p/p.go:9.21,11.10 1 1\nother.org/x/x.go:1.1,2.2 1 1\n"
	write("cover.out", profile)
	if err := fixProfile(filepath.Join(root, "cover.out"), root); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "cover.out"))
	if err != nil {
		t.Fatal(err)
	}
	want := profile +
		"example.com/m/p/p.go:3.15,3.22 0 1\n" +
		"example.com/m/p/p.go:5.13,5.39 0 1\n" +
		"example.com/m/p/p.go:12.7,12.27 0 1\n" +
		"example.com/m/p/p.go:14.7,14.14 0 1\n" +
		"example.com/m/p/limits.go:5.14,5.29 0 1\n"
	if string(b) != want {
		t.Errorf("profile =\n%s\nwant\n%s", b, want)
	}

	write("bad.out", "mode: set\nnot a block\n")
	if err := fixProfile(filepath.Join(root, "bad.out"), root); err == nil || !strings.Contains(err.Error(), `bad line "not a block"`) {
		t.Errorf("fixProfile on a malformed profile: %v", err)
	}
}
