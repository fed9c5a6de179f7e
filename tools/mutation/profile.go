package main

// Gremlins (v0.6.0) runs a mutant only when its position lies in a block that
// the package's coverage profile marks as executed. Go's coverage has no
// counter for two kinds of code that tests nevertheless execute, so gremlins
// reports their mutants as NOT COVERED and never tests them
// (go-gremlins/gremlins#298):
//
//   - the conditions of a switch's case clauses: the block of the statements
//     before the switch ends at "switch {", and each case body is a new block
//     that starts after the colon;
//   - the values of package-level const and var declarations, which are not
//     statements; a file that declares nothing else (no function) is not in
//     the profile at all.
//
// fixProfile adds a block for each: a case clause's conditions count as
// executed when the "switch" keyword is in an executed block (they are
// evaluated from the first case on until one matches, so a later case may in
// fact never be reached: its mutants then live, which is reported, not
// hidden), and package-level values always count (constants are compiled into
// every use and variables are initialised before any test runs), in the
// profiled files and in the package's other files that its build includes.
// The blocks carry no statements, so the profile's statement coverage is
// unchanged.

import (
	"bufio"
	"bytes"
	"fmt"
	"go/ast"
	"go/build"
	"go/parser"
	"go/token"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// block is one line of a coverage profile.
type block struct {
	startLine, startCol, endLine, endCol int
	count                                int64
}

func (b block) contains(p token.Position) bool {
	after := p.Line > b.startLine || p.Line == b.startLine && p.Column >= b.startCol
	before := p.Line < b.endLine || p.Line == b.endLine && p.Column <= b.endCol
	return after && before
}

var profileLine = regexp.MustCompile(`^(.+):([0-9]+)\.([0-9]+),([0-9]+)\.([0-9]+) ([0-9]+) ([0-9]+)$`)

// fixProfile rewrites the coverage profile file for the module rooted at
// root (whose go.mod names it), adding the blocks described above.
func fixProfile(profile, root string) error {
	data, err := os.ReadFile(profile)
	if err != nil {
		return err
	}
	module, err := modulePath(root)
	if err != nil {
		return err
	}
	extra, err := extraBlocks(data, func(file string) (string, bool) {
		rel, ok := strings.CutPrefix(file, module+"/")
		if !ok {
			return "", false
		}
		return filepath.Join(root, filepath.FromSlash(rel)), true
	})
	if err != nil {
		return err
	}
	if len(extra) == 0 {
		return nil
	}
	out := append(bytes.TrimRight(data, "\n"), '\n')
	out = append(out, extra...)
	return os.WriteFile(profile, out, 0o644)
}

func modulePath(root string) (string, error) {
	data, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "module "); ok {
			return strings.Trim(strings.TrimSpace(rest), `"`), nil
		}
	}
	return "", fmt.Errorf("%s/go.mod: no module line", root)
}

// extraBlocks returns the profile lines to add for the profile data; locate
// maps a profile's file name to the source file to parse (false: skip it).
func extraBlocks(data []byte, locate func(string) (string, bool)) ([]byte, error) {
	blocks := map[string][]block{}
	var files []string
	mode := ""
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := sc.Text()
		if m, ok := strings.CutPrefix(line, "mode: "); ok {
			mode = m
			continue
		}
		if line == "" {
			continue
		}
		m := profileLine.FindStringSubmatch(line)
		if m == nil {
			return nil, fmt.Errorf("coverage profile: bad line %q", line)
		}
		n := func(i int) int { v, _ := strconv.Atoi(m[i]); return v }
		cnt, _ := strconv.ParseInt(m[7], 10, 64)
		if _, seen := blocks[m[1]]; !seen {
			files = append(files, m[1])
		}
		blocks[m[1]] = append(blocks[m[1]], block{n(2), n(3), n(4), n(5), cnt})
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if mode == "" {
		return nil, fmt.Errorf("coverage profile: no mode line")
	}
	// A package's files that declare no function have no block, so they are
	// not in the profile: add each package's other files, in name order after
	// its profiled ones.
	var all []string
	dirs := map[string]bool{}
	for _, name := range files {
		all = append(all, name)
		dir := path.Dir(name)
		if dirs[dir] {
			continue
		}
		dirs[dir] = true
		src, ok := locate(name)
		if !ok {
			continue
		}
		others, err := declOnlyFiles(filepath.Dir(src), dir, blocks)
		if err != nil {
			return nil, fmt.Errorf("coverage profile: %w", err)
		}
		all = append(all, others...)
	}
	var out bytes.Buffer
	for _, name := range all {
		src, ok := locate(name)
		if !ok {
			continue
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, src, nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, fmt.Errorf("coverage profile: %w", err)
		}
		for _, b := range uncounted(fset, f, blocks[name]) {
			fmt.Fprintf(&out, "%s:%d.%d,%d.%d 0 1\n", name, b.startLine, b.startCol, b.endLine, b.endCol)
		}
	}
	return out.Bytes(), nil
}

// declOnlyFiles returns the profile names (importDir/file.go) of the Go files
// in srcDir that the package's build includes (build constraints and file
// name suffixes, test files excepted) and that have no block in the profile.
func declOnlyFiles(srcDir, importDir string, blocks map[string][]block) ([]string, error) {
	entries, err := os.ReadDir(srcDir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		n := e.Name()
		if e.IsDir() || !strings.HasSuffix(n, ".go") || strings.HasSuffix(n, "_test.go") {
			continue
		}
		name := importDir + "/" + n
		if _, profiled := blocks[name]; profiled {
			continue
		}
		match, err := build.Default.MatchFile(srcDir, n)
		if err != nil {
			return nil, err
		}
		if match {
			out = append(out, name)
		}
	}
	return out, nil
}

// uncounted returns the executed code of f that has no coverage block: the
// case conditions of every switch reached (the keyword in an executed block)
// and the values of package-level declarations.
func uncounted(fset *token.FileSet, f *ast.File, blocks []block) []block {
	executed := func(p token.Pos) bool {
		pos := fset.Position(p)
		for _, b := range blocks {
			if b.count > 0 && b.contains(pos) {
				return true
			}
		}
		return false
	}
	span := func(from, to ast.Node) block {
		s, e := fset.Position(from.Pos()), fset.Position(to.End())
		return block{s.Line, s.Column, e.Line, e.Column, 1}
	}
	var out []block
	for _, d := range f.Decls {
		gd, ok := d.(*ast.GenDecl)
		if !ok || (gd.Tok != token.CONST && gd.Tok != token.VAR) {
			continue
		}
		for _, s := range gd.Specs {
			vs, ok := s.(*ast.ValueSpec)
			if !ok || len(vs.Values) == 0 || hasFuncLit(vs) {
				continue // a function literal's body has blocks of its own
			}
			out = append(out, span(vs.Values[0], vs.Values[len(vs.Values)-1]))
		}
	}
	ast.Inspect(f, func(n ast.Node) bool {
		sw, ok := n.(*ast.SwitchStmt)
		if !ok || !executed(sw.Switch) {
			return true
		}
		for _, st := range sw.Body.List {
			if cc, ok := st.(*ast.CaseClause); ok && len(cc.List) > 0 {
				out = append(out, span(cc.List[0], cc.List[len(cc.List)-1]))
			}
		}
		return true
	})
	return out
}

func hasFuncLit(n ast.Node) bool {
	found := false
	ast.Inspect(n, func(n ast.Node) bool {
		if _, ok := n.(*ast.FuncLit); ok {
			found = true
		}
		return !found
	})
	return found
}
