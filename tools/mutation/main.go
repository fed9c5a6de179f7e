// Command mutation summarises gremlins' JSON results (gremlins unleash
// --output) for .ci/mutation: one table with each package's mutant counts,
// efficacy and mutant coverage against its target, then every mutant that
// lived or was not covered (file:line:column, mutator, source line), so a
// reader can kill it with a test or record why it is equivalent.
//
// Usage:
//
//	go run ./tools/mutation -dir .bin/mutation verifier=90 subjects=90 callout=90 door=85
//
// Each argument names a package directory (relative to the module root, the
// working directory) and its target in percent, applied to both efficacy and
// mutant coverage. The results are read from <dir>/<pkg>.json; the wall time,
// when .ci/mutation recorded it, from <dir>/<pkg>.wall (whole seconds).
//
// With -fix-profile FILE it instead completes a coverage profile that
// gremlins is about to read (profile.go; .ci/mutation arranges the call).
//
// Efficacy and mutant coverage are computed as gremlins does: efficacy is
// killed over killed + lived; mutant coverage is killed + lived over killed +
// lived + not covered. Timed-out and not-viable mutants are in neither. Unlike
// gremlins (which prints 0 % then), a package with no mutant at all reads
// 100 %. The exit status is
// 1 when a package misses its target or has no results, 2 on a usage error.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
)

// Gremlins' mutant statuses, as its JSON output spells them.
const (
	statusKilled     = "KILLED"
	statusLived      = "LIVED"
	statusNotCovered = "NOT COVERED"
	statusTimedOut   = "TIMED OUT"
	statusNotViable  = "NOT VIABLE"
	statusSkipped    = "SKIPPED"
)

// output is the part of gremlins' JSON output (internal/report/internal,
// v0.6.0) that the summary reads. Its totals are recomputed from the
// mutations, since the file has no timed-out count.
type output struct {
	Files []struct {
		Filename  string `json:"file_name"`
		Mutations []struct {
			Type   string `json:"type"`
			Status string `json:"status"`
			Line   int    `json:"line"`
			Column int    `json:"column"`
		} `json:"mutations"`
	} `json:"files"`
}

// mutant is one mutation of a package, its file relative to the module root.
type mutant struct {
	File   string
	Line   int
	Column int
	Type   string
	Status string
}

// summary is one package's result.
type summary struct {
	Pkg                                                     string
	Target                                                  float64
	Killed, Lived, NotCovered, TimedOut, NotViable, Skipped int
	Wall                                                    string // "" when unknown
	Mutants                                                 []mutant
	Err                                                     error // results missing or unreadable
}

// Efficacy is killed over killed + lived, in percent; 100 when no mutant ran
// and none was left uncovered (a package with nothing to mutate).
func (s summary) Efficacy() float64 {
	if s.Killed+s.Lived == 0 {
		if s.NotCovered == 0 {
			return 100
		}
		return 0
	}
	return 100 * float64(s.Killed) / float64(s.Killed+s.Lived)
}

// Coverage is killed + lived over killed + lived + not covered, in percent;
// 100 when there is nothing to cover.
func (s summary) Coverage() float64 {
	n := s.Killed + s.Lived + s.NotCovered
	if n == 0 {
		return 100
	}
	return 100 * float64(s.Killed+s.Lived) / float64(n)
}

// Met reports whether both figures reach the target.
func (s summary) Met() bool {
	return s.Err == nil && s.Efficacy() >= s.Target && s.Coverage() >= s.Target
}

// pct prints a percentage rounded down to one decimal, so that a figure just
// under its target (89.96) never reads as reaching it (90.0).
func pct(f float64) string {
	return fmt.Sprintf("%.1f%%", math.Floor(f*10)/10)
}

// parse reads one gremlins JSON file for package pkg.
func parse(r io.Reader, pkg string) (summary, error) {
	var out output
	if err := json.NewDecoder(r).Decode(&out); err != nil {
		return summary{}, fmt.Errorf("decoding gremlins output: %w", err)
	}
	s := summary{Pkg: pkg}
	for _, f := range out.Files {
		for _, m := range f.Mutations {
			mu := mutant{File: filepath.ToSlash(filepath.Join(pkg, f.Filename)), Line: m.Line, Column: m.Column, Type: m.Type, Status: m.Status}
			switch m.Status {
			case statusKilled:
				s.Killed++
			case statusLived:
				s.Lived++
			case statusNotCovered:
				s.NotCovered++
			case statusTimedOut:
				s.TimedOut++
			case statusNotViable:
				s.NotViable++
			case statusSkipped:
				s.Skipped++
			default:
				return summary{}, fmt.Errorf("%s:%d: unknown mutant status %q", mu.File, mu.Line, m.Status)
			}
			s.Mutants = append(s.Mutants, mu)
		}
	}
	sort.Slice(s.Mutants, func(i, j int) bool {
		a, b := s.Mutants[i], s.Mutants[j]
		if a.File != b.File {
			return a.File < b.File
		}
		if a.Line != b.Line {
			return a.Line < b.Line
		}
		if a.Column != b.Column {
			return a.Column < b.Column
		}
		return a.Type < b.Type
	})
	return s, nil
}

// load reads <dir>/<pkg>.json and, if present, <dir>/<pkg>.wall.
func load(dir, pkg string, target float64) summary {
	s := summary{Pkg: pkg, Target: target}
	f, err := os.Open(filepath.Join(dir, pkg+".json"))
	if err != nil {
		s.Err = err
		return s
	}
	defer f.Close()
	parsed, err := parse(f, pkg)
	if err != nil {
		s.Err = fmt.Errorf("%s: %w", f.Name(), err)
		return s
	}
	parsed.Target = target
	if b, err := os.ReadFile(filepath.Join(dir, pkg+".wall")); err == nil {
		if sec, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			parsed.Wall = fmt.Sprintf("%dm%02ds", sec/60, sec%60)
		}
	}
	return parsed
}

// parseTarget reads a "pkg=percent" argument.
func parseTarget(arg string) (string, float64, error) {
	pkg, pct, ok := strings.Cut(arg, "=")
	if !ok || pkg == "" {
		return "", 0, fmt.Errorf("argument %q: want package=percent", arg)
	}
	v, err := strconv.ParseFloat(pct, 64)
	if err != nil || v < 0 || v > 100 {
		return "", 0, fmt.Errorf("argument %q: target must be a percentage", arg)
	}
	return filepath.Clean(pkg), v, nil
}

// sourceLine returns line n of file, trimmed, or "" when it cannot be read.
func sourceLine(file string, n int) string {
	f, err := os.Open(file)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for i := 1; sc.Scan(); i++ {
		if i == n {
			return strings.TrimSpace(sc.Text())
		}
	}
	return ""
}

// report writes the table and the mutants to act on; it returns whether every
// package met its target.
func report(w io.Writer, sums []summary, withSource bool) bool {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "package\tkilled\tlived\tnot covered\ttimed out\tnot viable\tefficacy\tcoverage\ttarget\twall\t\t")
	ok := true
	for _, s := range sums {
		verdict := "met"
		if !s.Met() {
			verdict = "MISSED"
			ok = false
		}
		if s.Err != nil {
			fmt.Fprintf(tw, "%s\t-\t-\t-\t-\t-\t-\t-\t%g%%\t%s\t%s\t\n", s.Pkg, s.Target, dash(s.Wall), "NO RESULTS")
			continue
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%g%%\t%s\t%s\t\n",
			s.Pkg, s.Killed, s.Lived, s.NotCovered, s.TimedOut, s.NotViable, pct(s.Efficacy()), pct(s.Coverage()), s.Target, dash(s.Wall), verdict)
	}
	tw.Flush()

	for _, s := range sums {
		if s.Err != nil {
			fmt.Fprintf(w, "\n%s: no results: %v\n", s.Pkg, s.Err)
		}
	}
	for _, st := range []string{statusLived, statusNotCovered, statusTimedOut} {
		var list []mutant
		for _, s := range sums {
			for _, m := range s.Mutants {
				if m.Status == st {
					list = append(list, m)
				}
			}
		}
		if len(list) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n%s (%d):\n", st, len(list))
		for _, m := range list {
			line := fmt.Sprintf("  %s:%d:%d %s", m.File, m.Line, m.Column, m.Type)
			if withSource {
				if src := sourceLine(m.File, m.Line); src != "" {
					line += "  | " + src
				}
			}
			fmt.Fprintln(w, line)
		}
	}
	return ok
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("mutation", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("dir", ".bin/mutation", "directory holding <pkg>.json (and <pkg>.wall)")
	withSource := fs.Bool("source", true, "show the source line of each listed mutant")
	fixFile := fs.String("fix-profile", "", "add the blocks Go's coverage does not count to this coverage profile (see profile.go) and exit")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: mutation [-dir DIR] [-source=false] pkg=percent ...\n       mutation -fix-profile FILE (run in the module root)")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *fixFile != "" {
		if err := fixProfile(*fixFile, "."); err != nil {
			fmt.Fprintln(stderr, "mutation:", err)
			return 1
		}
		return 0
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return 2
	}
	var sums []summary
	for _, a := range fs.Args() {
		pkg, target, err := parseTarget(a)
		if err != nil {
			fmt.Fprintln(stderr, "mutation:", err)
			return 2
		}
		sums = append(sums, load(*dir, pkg, target))
	}
	if !report(stdout, sums, *withSource) {
		return 1
	}
	return 0
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}
