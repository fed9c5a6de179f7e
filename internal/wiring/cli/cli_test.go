package cli_test

import (
	"bytes"
	"context"
	"flag"
	"strings"
	"testing"
	"time"

	"github.com/compass-runner/identity/internal/wiring/cli"
)

// recordCommand has --data-file, whose variable a design record names
// COMPASS_RECORD_DATA_FILE, --wait, named COMPASS_RECORD_WAIT, and --plain,
// named by the one rule only.
func recordCommand(data, plain *string, wait *time.Duration) *cli.Command {
	return &cli.Command{
		Name: "recorded",
		Help: "a command with record names",
		Env: []cli.EnvVar{
			{Name: "COMPASS_SECRET", Usage: "a secret"},
			{Name: "COMPASS_RECORD_DATA_FILE", Flag: "data-file"},
			{Name: "COMPASS_RECORD_WAIT", Flag: "wait"},
		},
		Flags: func(fs *flag.FlagSet) cli.RunFunc {
			fs.StringVar(data, "data-file", "", "data")
			fs.StringVar(plain, "plain", "", "plain")
			fs.DurationVar(wait, "wait", 0, "wait")
			return func(context.Context, *cli.Invocation) error { return nil }
		},
	}
}

func TestEnvNamesPutTheRecordFirst(t *testing.T) {
	var data, plain string
	var wait time.Duration
	cmd := recordCommand(&data, &plain, &wait)
	for flagName, want := range map[string]string{
		"data-file": "COMPASS_RECORD_DATA_FILE COMPASS_DATA_FILE",
		"wait":      "COMPASS_RECORD_WAIT COMPASS_WAIT",
		"plain":     "COMPASS_PLAIN",
	} {
		if got := strings.Join(cmd.EnvNames(flagName), " "); got != want {
			t.Errorf("EnvNames(%q) = %s, want %s", flagName, got, want)
		}
	}
}

// A flag falls back to the record's name and to the one rule's; the two
// set alike are fine, set differently a usage error naming both and
// neither value; the flag on the command line wins over both.
func TestRecordNameAndRuleName(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want string // --data-file; "error" for a usage error
	}{
		{"neither", nil, nil, ""},
		{"record", nil, map[string]string{"COMPASS_RECORD_DATA_FILE": "/r"}, "/r"},
		{"rule", nil, map[string]string{"COMPASS_DATA_FILE": "/d"}, "/d"},
		{"both alike", nil, map[string]string{"COMPASS_RECORD_DATA_FILE": "/r", "COMPASS_DATA_FILE": "/r"}, "/r"},
		{"both differ", nil, map[string]string{"COMPASS_RECORD_DATA_FILE": "/r", "COMPASS_DATA_FILE": "/d"}, "error"},
		{"empty record", nil, map[string]string{"COMPASS_RECORD_DATA_FILE": "", "COMPASS_DATA_FILE": "/d"}, "/d"},
		{"flag wins", []string{"--data-file", "/f"}, map[string]string{"COMPASS_RECORD_DATA_FILE": "/r", "COMPASS_DATA_FILE": "/d"}, "/f"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var data, plain string
			var wait time.Duration
			cmd := recordCommand(&data, &plain, &wait)
			_, err := cli.Parse(cmd, cmd, tc.args, func(k string) string { return tc.env[k] })
			if tc.want == "error" {
				if !cli.IsUsage(err) {
					t.Fatalf("err = %v, want a usage error", err)
				}
				msg := err.Error()
				if !strings.Contains(msg, "COMPASS_RECORD_DATA_FILE") || !strings.Contains(msg, "COMPASS_DATA_FILE") ||
					strings.Contains(msg, "/r") || strings.Contains(msg, "/d") {
					t.Fatalf("err = %q, want both variables named and neither value", msg)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if data != tc.want {
				t.Fatalf("--data-file = %q, want %q", data, tc.want)
			}
		})
	}
}

// A bad value under the record's name is a usage error naming that variable.
func TestRecordNameBadValueNamesIt(t *testing.T) {
	var data, plain string
	var wait time.Duration
	cmd := recordCommand(&data, &plain, &wait)
	_, err := cli.Parse(cmd, cmd, nil, func(k string) string {
		if k == "COMPASS_RECORD_WAIT" {
			return "soon"
		}
		return ""
	})
	if want := "COMPASS_RECORD_WAIT=soon: want a duration such as 30s"; !cli.IsUsage(err) || err.Error() != want {
		t.Fatalf("err = %v, want the usage error %q", err, want)
	}
}

// --help lists the record's name as the flag's variable, first, with the
// rule's beside it, and keeps the environment-only list to secrets.
func TestHelpListsRecordName(t *testing.T) {
	var data, plain string
	var wait time.Duration
	cmd := recordCommand(&data, &plain, &wait)
	var out bytes.Buffer
	if code := cli.Run(t.Context(), cmd, []string{"--help"}, func(string) string { return "" }, &out, &bytes.Buffer{}); code != cli.ExitOK {
		t.Fatalf("--help: exit %d", code)
	}
	help := out.String()
	lines := map[string]string{}
	for _, line := range strings.Split(help, "\n") {
		if name, _, ok := strings.Cut(strings.TrimPrefix(line, "  --"), " "); ok && strings.HasPrefix(line, "  --") {
			lines[name] = line
		}
	}
	for flagName, want := range map[string][]string{
		"data-file": {"COMPASS_RECORD_DATA_FILE", "COMPASS_DATA_FILE"},
		"wait":      {"COMPASS_RECORD_WAIT", "COMPASS_WAIT"},
		"plain":     {"COMPASS_PLAIN"},
	} {
		line := lines[flagName]
		if !strings.Contains(line, "(env "+want[0]) {
			t.Errorf("--%s is listed as %q; want (env %s first", flagName, line, want[0])
		}
		for _, env := range want {
			if !strings.Contains(line, env) {
				t.Errorf("--%s is listed as %q; want %s", flagName, line, env)
			}
		}
	}
	_, envOnly, ok := strings.Cut(help, "Environment only")
	if !ok || !strings.Contains(envOnly, "COMPASS_SECRET") || strings.Contains(envOnly, "COMPASS_RECORD_") {
		t.Fatalf("environment-only section %q; want COMPASS_SECRET only", envOnly)
	}
}

// A record name for a flag the command does not have is a programming error.
func TestRecordNameForNoFlagPanics(t *testing.T) {
	cmd := &cli.Command{
		Name:  "broken",
		Env:   []cli.EnvVar{{Name: "COMPASS_RECORD_X", Flag: "x"}},
		Flags: func(*flag.FlagSet) cli.RunFunc { return nil },
	}
	defer func() {
		if r := recover(); r == nil || !strings.Contains(r.(string), "COMPASS_RECORD_X names no flag --x") {
			t.Fatalf("recover() = %v, want a panic naming COMPASS_RECORD_X and --x", r)
		}
	}()
	_, _ = cli.Parse(cmd, cmd, nil, func(string) string { return "" })
}
