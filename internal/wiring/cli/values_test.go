package cli_test

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/compass-runner/identity/internal/wiring/cli"
)

// mode is an enum of the commands' own kind (callout's --mode): its Set
// error says what it accepts.
type mode string

func (m *mode) String() string { return string(*m) }
func (m *mode) Set(v string) error {
	if v != "up" && v != "down" {
		return errors.New("want up or down")
	}
	*m = mode(v)
	return nil
}

// typed is a command with a flag of every type the commands use, and a run
// function that returns runErr.
func typed(runErr func(in *cli.Invocation) error) *cli.Command {
	return &cli.Command{
		Name: "typed",
		Help: "flags of every type",
		Logs: true,
		Flags: func(fs *flag.FlagSet) cli.RunFunc {
			var (
				d      time.Duration
				i      int
				i64    int64
				u      uint
				u64    uint64
				f      float64
				b      bool
				s, out string
				m      = mode("up")
			)
			fs.DurationVar(&d, "wait", 30*time.Second, "a duration")
			fs.IntVar(&i, "workers", 4, "an int")
			fs.Int64Var(&i64, "big", 0, "an int64")
			fs.UintVar(&u, "count", 0, "a uint")
			fs.Uint64Var(&u64, "bytes", 0, "a uint64")
			fs.Float64Var(&f, "ratio", 0, "a float64")
			fs.BoolVar(&b, "no-kick", false, "a bool")
			fs.StringVar(&s, "server", "", "a URL")
			fs.Var(&m, "mode", "an enum of its own")
			cli.EnumVar(fs, &out, "output", "table", "a toolkit enum", "table", "json")
			return func(_ context.Context, in *cli.Invocation) error {
				if runErr == nil {
					return nil
				}
				return runErr(in)
			}
		},
	}
}

// runTyped runs the typed command with args and env; it returns the exit
// code and stderr.
func runTyped(t *testing.T, cmd *cli.Command, env map[string]string, args ...string) (int, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := cli.Run(t.Context(), cmd, args, func(k string) string { return env[k] }, &stdout, &stderr)
	return code, stderr.String()
}

// Every flag type's refusal, from the command line and from the
// environment: the source as written, the value as given, what is accepted.
// One line on stderr, exit 2.
func TestRefusedValueSaysWhatIsAccepted(t *testing.T) {
	long := strings.Repeat("x", 33)
	for _, tc := range []struct {
		flag, value, want string
	}{
		{"wait", "5", "want a duration such as 30s"},
		{"wait", "soon", "want a duration such as 30s"},
		{"wait", "7d", "want a duration such as 30s; the largest unit is h (7d is 168h)"},
		{"wait", "1.5d", "want a duration such as 30s; the largest unit is h (1.5d is 36h)"},
		{"workers", "x", "want a whole number such as 4"},
		{"workers", "99999999999999999999", "want a whole number from -9223372036854775808 to 9223372036854775807"},
		{"big", "1e3", "want a whole number such as 4"},
		{"count", "-1", "want a whole number such as 4"},
		{"bytes", "99999999999999999999", "want a whole number from 0 to 18446744073709551615"},
		{"ratio", "half", "want a number such as 1.5"},
		{"no-kick", "maybe", "want true or false"},
		{"mode", "sideways", "want up or down"},
		{"output", "yaml", "want table or json"},
		{"log-format", "xml", "want json or text"},
		{"log-level", "loud", "want debug, info, warn or error"},
	} {
		for _, source := range []string{"flag", "env"} {
			t.Run(tc.flag+" "+tc.value+" by "+source, func(t *testing.T) {
				var args []string
				var env map[string]string
				var want string
				if source == "flag" {
					args = []string{"--" + tc.flag + "=" + tc.value}
					want = fmt.Sprintf("typed: --%s %s: %s\n", tc.flag, tc.value, tc.want)
				} else {
					env = map[string]string{cli.EnvName(tc.flag): tc.value}
					want = fmt.Sprintf("typed: %s=%s: %s\n", cli.EnvName(tc.flag), tc.value, tc.want)
				}
				code, stderr := runTyped(t, typed(nil), env, args...)
				if code != cli.ExitUsage || stderr != want {
					t.Fatalf("exit %d, stderr %q; want exit 2 and %q", code, stderr, want)
				}
			})
		}
	}
	// The value as typed on the command line, in two words, is shown alike;
	// an empty one and one with spaces are quoted; a long one is shown by
	// its length only (a token pasted into the wrong variable stays out of
	// the logs).
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"--wait", "5"}, nil, "typed: --wait 5: want a duration such as 30s\n"},
		{[]string{"--wait", ""}, nil, `typed: --wait "": want a duration such as 30s` + "\n"},
		{nil, map[string]string{"COMPASS_WAIT": "5 s"}, `typed: COMPASS_WAIT="5 s": want a duration such as 30s` + "\n"},
		{nil, map[string]string{"COMPASS_WAIT": long}, "typed: COMPASS_WAIT=<33 bytes, not shown>: want a duration such as 30s\n"},
	} {
		if code, stderr := runTyped(t, typed(nil), tc.env, tc.args...); code != cli.ExitUsage || stderr != tc.want {
			t.Fatalf("%v %v: exit %d, stderr %q; want exit 2 and %q", tc.args, tc.env, code, stderr, tc.want)
		}
	}
}

// The wrapped flags still parse as before: a boolean without a value, every
// type from the command line and the environment, the command line winning.
func TestWrappedFlagsStillParse(t *testing.T) {
	cmd := typed(nil)
	env := map[string]string{"COMPASS_WORKERS": "7", "COMPASS_LOG_LEVEL": "DEBUG", "COMPASS_OUTPUT": "json", "COMPASS_WAIT": "1m"}
	fs, err := cli.Parse(cmd, cmd, []string{"--no-kick", "--wait", "2s", "--mode", "down", "--ratio", "0.5"}, func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{
		"no-kick": "true", "wait": "2s", "mode": "down", "ratio": "0.5",
		"workers": "7", "log-level": "DEBUG", "output": "json", "log-format": "json", "count": "0",
	} {
		if got := fs.Lookup(name).Value.String(); got != want {
			t.Errorf("--%s = %q, want %q", name, got, want)
		}
	}
	if g, ok := fs.Lookup("wait").Value.(flag.Getter); !ok || g.Get() != 2*time.Second {
		t.Errorf("--wait's Get() is not the duration")
	}
}

// --help still names each flag's type, and an Enum's words.
func TestHelpNamesTypesAndWords(t *testing.T) {
	var out bytes.Buffer
	if code := cli.Run(t.Context(), typed(nil), []string{"--help"}, func(string) string { return "" }, &out, &bytes.Buffer{}); code != cli.ExitOK {
		t.Fatalf("--help: exit %d", code)
	}
	for _, want := range []string{
		"  --wait duration  (env COMPASS_WAIT)", "  --workers int  (env COMPASS_WORKERS)", "  --no-kick  (env COMPASS_NO_KICK)",
		"  --output table|json  (env COMPASS_OUTPUT)", "  --log-format json|text  (env COMPASS_LOG_FORMAT)", "  --ratio float  (env COMPASS_RATIO)",
	} {
		if !strings.Contains(out.String(), want+"\n") {
			t.Errorf("--help lacks %q:\n%s", want, out.String())
		}
	}
}

// A command's own refusal of a value (Invocation.BadValue) takes the same
// form, from where the value came; an error a command or a library writes
// about a flag set from the environment is followed by the variable's name,
// never its value; a flag given on the command line, or a longer flag's
// name, adds nothing.
func TestCommandErrorsNameTheVariable(t *testing.T) {
	bad := typed(func(in *cli.Invocation) error { return in.BadValue("wait", "must be at least 1m") })
	lib := typed(func(*cli.Invocation) error {
		return fmt.Errorf("lib: --server \"http://x\": must be https:// (and --no-kick is off, --server-image unused)")
	})
	for _, tc := range []struct {
		name string
		cmd  *cli.Command
		args []string
		env  map[string]string
		code int
		want string
	}{
		{"BadValue by flag", bad, []string{"--wait", "5s"}, nil, cli.ExitUsage, "typed: --wait 5s: must be at least 1m\n"},
		{"BadValue by variable", bad, nil, map[string]string{"COMPASS_WAIT": "5s"}, cli.ExitUsage, "typed: COMPASS_WAIT=5s: must be at least 1m\n"},
		{"BadValue of the default", bad, nil, nil, cli.ExitUsage, "typed: --wait 30s: must be at least 1m\n"},
		{"library error by flag", lib, []string{"--server", "http://x"}, nil, cli.ExitFailure,
			"typed: lib: --server \"http://x\": must be https:// (and --no-kick is off, --server-image unused)\n"},
		{"library error by variable", lib, nil, map[string]string{"COMPASS_SERVER": "http://x", "COMPASS_SERVER_IMAGE": "i"}, cli.ExitFailure,
			"typed: lib: --server \"http://x\": must be https:// (and --no-kick is off, --server-image unused) (--server was read from COMPASS_SERVER)\n"},
		{"library error naming two variables", lib, nil, map[string]string{"COMPASS_SERVER": "http://x", "COMPASS_NO_KICK": "false"}, cli.ExitFailure,
			"typed: lib: --server \"http://x\": must be https:// (and --no-kick is off, --server-image unused) (--no-kick was read from COMPASS_NO_KICK, --server from COMPASS_SERVER)\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if code, stderr := runTyped(t, tc.cmd, tc.env, tc.args...); code != tc.code || stderr != tc.want {
				t.Fatalf("exit %d, stderr %q; want exit %d and %q", code, stderr, tc.code, tc.want)
			}
		})
	}
	usage := typed(func(*cli.Invocation) error { return cli.UsageError(errors.New("--server must be https://")) })
	code, stderr := runTyped(t, usage, map[string]string{"COMPASS_SERVER": "http://secret-host"})
	if code != cli.ExitUsage || stderr != "typed: --server must be https:// (--server was read from COMPASS_SERVER)\n" {
		t.Fatalf("a usage error about a variable's flag: exit %d, stderr %q", code, stderr)
	}
}

// help and version exit 0 however they are asked, on a program with
// commands and on one without; help for what does not exist is a usage
// error.
func TestHelpAndVersionWordsExitZero(t *testing.T) {
	sub := typed(nil)
	sub.Name, sub.Summary = "sub", "a subcommand"
	multi := &cli.Command{Name: "multi", Help: "a program with commands", Subcommands: []*cli.Command{sub}}
	single := typed(nil)
	for _, tc := range []struct {
		prog *cli.Command
		args []string
		want string // the start of stdout
	}{
		{multi, []string{"help"}, "Usage: multi <command>"},
		{multi, []string{"--help"}, "Usage: multi <command>"},
		{multi, []string{"-h"}, "Usage: multi <command>"},
		{multi, []string{"help", "--help"}, "Usage: multi <command>"},
		{multi, []string{"help", "help"}, "Usage: multi help [command]"},
		{multi, []string{"help", "version"}, "Usage: multi version\n"},
		{multi, []string{"version", "--help"}, "Usage: multi version\n"},
		{multi, []string{"version", "-h"}, "Usage: multi version\n"},
		{multi, []string{"--version", "--help"}, "Usage: multi version\n"},
		{multi, []string{"version"}, "multi "},
		{multi, []string{"help", "sub"}, "Usage: multi sub [flags]"},
		{multi, []string{"help", "sub", "--help"}, "Usage: multi sub [flags]"},
		{multi, []string{"sub", "--help"}, "Usage: multi sub [flags]"},
		{multi, []string{"sub", "-h"}, "Usage: multi sub [flags]"},
		{single, []string{"help"}, "Usage: typed [flags]"},
		{single, []string{"--help"}, "Usage: typed [flags]"},
		{single, []string{"help", "--help"}, "Usage: typed [flags]"},
		{single, []string{"help", "help"}, "Usage: typed help [command]"},
		{single, []string{"help", "version"}, "Usage: typed version\n"},
		{single, []string{"version", "--help"}, "Usage: typed version\n"},
		{single, []string{"version"}, "typed "},
	} {
		var stdout, stderr bytes.Buffer
		code := cli.Run(t.Context(), tc.prog, tc.args, func(string) string { return "" }, &stdout, &stderr)
		if code != cli.ExitOK || !strings.HasPrefix(stdout.String(), tc.want) || stderr.Len() != 0 {
			t.Errorf("%s %v: exit %d, stdout %q, stderr %q; want exit 0 and stdout starting %q", tc.prog.Name, tc.args, code, stdout.String(), stderr.String(), tc.want)
		}
	}
	for _, tc := range []struct {
		prog *cli.Command
		args []string
		want string
	}{
		{multi, []string{"help", "nope"}, "multi: help: unknown command \"nope\" (see multi --help)\n"},
		{multi, []string{"help", "sub", "extra"}, "multi: help: unknown command \"sub extra\" (see multi --help)\n"},
		{multi, []string{"version", "extra"}, "multi: version takes no arguments\n"},
		{single, []string{"help", "nope"}, "typed: help: unknown command \"nope\" (see typed --help)\n"},
	} {
		var stdout, stderr bytes.Buffer
		code := cli.Run(t.Context(), tc.prog, tc.args, func(string) string { return "" }, &stdout, &stderr)
		if code != cli.ExitUsage || stdout.Len() != 0 || stderr.String() != tc.want {
			t.Errorf("%s %v: exit %d, stdout %q, stderr %q; want exit 2 and %q", tc.prog.Name, tc.args, code, stdout.String(), stderr.String(), tc.want)
		}
	}
}
