// Command vulncheck filters `govulncheck -format json` output for CI: it fails
// on every vulnerability the code calls in a module this project requires, and
// reports (without failing) the ones in the Go standard library, which are
// fixed by moving the machine's Go toolchain rather than go.mod.
//
// Usage: govulncheck -format json ./... | go run ./.ci/vulncheck
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
)

type message struct {
	OSV *struct {
		ID      string `json:"id"`
		Summary string `json:"summary"`
	} `json:"osv"`
	Finding *struct {
		OSV          string `json:"osv"`
		FixedVersion string `json:"fixed_version"`
		Trace        []struct {
			Module   string `json:"module"`
			Version  string `json:"version"`
			Function string `json:"function"`
		} `json:"trace"`
	} `json:"finding"`
}

func main() {
	if err := run(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "vulncheck:", err)
		os.Exit(1)
	}
}

func run(in io.Reader, out io.Writer) error {
	summaries := map[string]string{}
	called := map[string]string{} // osv -> "module@version (fixed in ...)"
	dec := json.NewDecoder(in)
	for {
		var m message
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return fmt.Errorf("reading govulncheck output: %w", err)
		}
		if m.OSV != nil {
			summaries[m.OSV.ID] = m.OSV.Summary
		}
		if f := m.Finding; f != nil && len(f.Trace) > 0 && f.Trace[0].Function != "" {
			called[f.OSV] = fmt.Sprintf("%s@%s (fixed in %s)", f.Trace[0].Module, f.Trace[0].Version, f.FixedVersion)
		}
	}
	ids := make([]string, 0, len(called))
	for id := range called {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	var fail int
	for _, id := range ids {
		where := called[id]
		kind := "FAIL"
		if len(where) >= 7 && where[:7] == "stdlib@" {
			kind = "toolchain"
		} else {
			fail++
		}
		fmt.Fprintf(out, "%-9s %s %s: %s\n", kind, id, where, summaries[id])
	}
	fmt.Fprintf(out, "vulncheck: %d called vulnerabilities in required modules, %d in the standard library of this Go toolchain\n", fail, len(ids)-fail)
	if fail > 0 {
		return fmt.Errorf("%d called vulnerabilities in required modules", fail)
	}
	return nil
}
