package commands_test

import (
	"strings"
	"testing"

	"github.com/compass-runner/identity/internal/wiring/cli"
	"github.com/compass-runner/identity/internal/wiring/commands"
)

// compass-runner's --token-file reads COMPASS_RUNNER_TOKEN_FILE, the name
// DL-440 gives it, and still COMPASS_TOKEN_FILE, the toolkit's spelling: one
// of them or both with the same value set the flag, both with different
// values are a usage error naming both, and the flag given wins over both.
func TestRunnerTokenFileVariables(t *testing.T) {
	const (
		record  = "COMPASS_RUNNER_TOKEN_FILE"
		toolkit = "COMPASS_TOKEN_FILE"
		a, b    = "/var/run/secrets/compass/runner/token", "/etc/compass/token"
	)
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want string // --token-file; empty: a usage error
	}{
		{"the record's name", nil, map[string]string{record: a}, a},
		{"the toolkit's name", nil, map[string]string{toolkit: a}, a},
		{"both, the same", nil, map[string]string{record: a, toolkit: a}, a},
		{"both, different", nil, map[string]string{record: a, toolkit: b}, ""},
		{"the toolkit's name and an empty record's name", nil, map[string]string{record: "", toolkit: b}, b},
		{"the flag over both", []string{"--token-file", "/flag/token"}, map[string]string{record: a, toolkit: b}, "/flag/token"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs, err := cli.Parse(commands.Runner, commands.Runner, tc.args, func(k string) string { return tc.env[k] })
			if tc.want == "" {
				if !cli.IsUsage(err) || !strings.Contains(err.Error(), record) || !strings.Contains(err.Error(), toolkit) {
					t.Fatalf("err = %v, want a usage error naming %s and %s", err, record, toolkit)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := fs.Lookup("token-file").Value.String(); got != tc.want {
				t.Fatalf("--token-file = %q, want %q", got, tc.want)
			}
		})
	}
}

// --help lists COMPASS_RUNNER_TOKEN_FILE as --token-file's variable, first,
// and the toolkit's COMPASS_TOKEN_FILE beside it; it is not listed as an
// environment-only variable.
func TestRunnerHelpListsTokenFileVariable(t *testing.T) {
	code, help, _ := run(t, commands.Runner, nil, "--help")
	if code != cli.ExitOK {
		t.Fatalf("--help: exit %d", code)
	}
	line := flagHelpLine(t, help, "token-file")
	if !strings.Contains(line, "(env COMPASS_RUNNER_TOKEN_FILE") || !strings.Contains(line, "COMPASS_TOKEN_FILE") {
		t.Fatalf("--token-file is listed as %q; want COMPASS_RUNNER_TOKEN_FILE first, and COMPASS_TOKEN_FILE", line)
	}
	_, envOnly, ok := strings.Cut(help, "Environment only")
	if !ok || !strings.Contains(envOnly, "COMPASS_RUNNER_TOKEN ") || strings.Contains(envOnly, "COMPASS_RUNNER_TOKEN_FILE") {
		t.Fatalf("environment-only section: %q; want COMPASS_RUNNER_TOKEN and not COMPASS_RUNNER_TOKEN_FILE", envOnly)
	}
}
