package commands_test

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/compass-runner/identity/internal/wiring/cli"
	"github.com/compass-runner/identity/internal/wiring/commands"
	"github.com/compass-runner/identity/runner"
)

// programs are the three daemons' command lines.
func programs() []*cli.Command {
	return []*cli.Command{commands.Callout, commands.Runner, commands.Server}
}

// leaf is one command to run: the program and the command (the program
// itself when it has no subcommands).
type leaf struct{ prog, cmd *cli.Command }

func (l leaf) name() string {
	if l.prog == l.cmd {
		return l.prog.Name
	}
	return l.prog.Name + " " + l.cmd.Name
}

// argv is how to call the command with args.
func (l leaf) argv(args ...string) []string {
	if l.prog == l.cmd {
		return args
	}
	return append([]string{l.cmd.Name}, args...)
}

func leaves() []leaf {
	var ls []leaf
	for _, p := range programs() {
		if len(p.Subcommands) == 0 {
			ls = append(ls, leaf{p, p})
		}
		for _, c := range p.Subcommands {
			ls = append(ls, leaf{p, c})
		}
	}
	return ls
}

func run(t *testing.T, prog *cli.Command, env map[string]string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var o, e bytes.Buffer
	code = cli.Run(t.Context(), prog, args, func(k string) string { return env[k] }, &o, &e)
	return code, o.String(), e.String()
}

// refuseWithin bounds a command the test expects to refuse at once: one
// that instead serves (a broken guard) fails with its name rather than
// hanging until the package's timeout.
const refuseWithin = 30 * time.Second

// runServerWithin is runServer bounded by d: a command still running then is
// stopped and the test fails, naming it.
func runServerWithin(t *testing.T, d time.Duration, env map[string]string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), d)
	defer cancel()
	var o, e bytes.Buffer
	code = cli.Run(ctx, commands.Server, args, func(k string) string { return env[k] }, &o, &e)
	if ctx.Err() != nil {
		t.Fatalf("compass-server %s was still running after %s, where it should have refused; stderr %q", strings.Join(args, " "), d, e.String())
	}
	return code, o.String(), e.String()
}

// runServer runs compass-server with args and an environment.
func runServer(t *testing.T, env map[string]string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	return run(t, commands.Server, env, args...)
}

func writeFile(t *testing.T, path, data string) string {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// runStopped runs prog as run does, under a context already cancelled: a
// start refused before the command uses its context is unchanged, and one
// that is not refused ends at once instead of running until the test's end.
func runStopped(t *testing.T, prog *cli.Command, env map[string]string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	var o, e bytes.Buffer
	code = cli.Run(ctx, prog, args, func(k string) string { return env[k] }, &o, &e)
	return code, o.String(), e.String()
}

// flagNames lists a command's flags (--version is the toolkit's own).
func flagNames(t *testing.T, cmd *cli.Command) []*flag.Flag {
	t.Helper()
	fs := flag.NewFlagSet(cmd.Name, flag.ContinueOnError)
	if cmd.Flags != nil {
		cmd.Flags(fs)
	}
	var fl []*flag.Flag
	fs.VisitAll(func(f *flag.Flag) { fl = append(fl, f) })
	return fl
}

// validValue finds a value the flag accepts, trying the shapes the commands use.
func validValue(t *testing.T, f *flag.Flag) string {
	t.Helper()
	for _, v := range []string{"17s", "3", "true", "operator", "keep", "json", "value-x", "us-east=tls://nats.example:7222"} {
		if f.Value.Set(v) == nil {
			return v
		}
	}
	t.Fatalf("--%s accepts none of the candidate values", f.Name)
	return ""
}

// flagHelpLine is the line of help's flag list that lists flag name.
func flagHelpLine(t *testing.T, help, name string) string {
	t.Helper()
	_, list, ok := strings.Cut(help, "\nFlags (")
	if !ok {
		t.Fatalf("--help has no flag list:\n%s", help)
	}
	for _, line := range strings.Split(list, "\n") {
		if line == "  --"+name || strings.HasPrefix(line, "  --"+name+" ") {
			return line
		}
	}
	t.Fatalf("--help lacks --%s:\n%s", name, help)
	return ""
}

// flagHelpEntry is a flag's whole entry in help's flag list: its line and
// the explanation indented under it, joined by spaces.
func flagHelpEntry(t *testing.T, help, name string) string {
	t.Helper()
	first := flagHelpLine(t, help, name)
	_, rest, _ := strings.Cut(help, first+"\n")
	entry := []string{first}
	for _, line := range strings.Split(rest, "\n") {
		if !strings.HasPrefix(line, "      ") {
			break
		}
		entry = append(entry, strings.TrimSpace(line))
	}
	return strings.Join(entry, " ")
}

// findCommand is compass-server's subcommand name.
func findCommand(t *testing.T, name string) *cli.Command {
	t.Helper()
	for _, c := range commands.Server.Subcommands {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("compass-server has no command %s", name)
	return nil
}

// Every flag of every command falls back to COMPASS_<FLAG_NAME> by the one
// rule, and to the name a design record fixes for it where the command
// declares one (cmd.EnvNames), and is listed in --help with its variables,
// the winning one first; a bad flag exits 2 with one line on stderr; --help
// and "help <command>" exit 0 on stdout.
func TestEveryFlagOfEveryCommand(t *testing.T) {
	for _, l := range leaves() {
		t.Run(l.name(), func(t *testing.T) {
			code, help, _ := run(t, l.prog, nil, l.argv("--help")...)
			if code != cli.ExitOK || !strings.HasPrefix(help, "Usage: "+l.name()+" [flags]") {
				t.Fatalf("--help: exit %d, output:\n%s", code, help)
			}
			// Every way of asking for the command's help prints the same, exit 0.
			asks := [][]string{l.argv("-h"), l.argv("-help"), l.argv("--help", "--bogus")}
			if l.prog != l.cmd {
				asks = append(asks, []string{"help", l.cmd.Name}, []string{"help", l.cmd.Name, "--help"}, []string{"help", "--help", l.cmd.Name})
			} else {
				asks = append(asks, []string{"help"}, []string{"help", "--help"})
			}
			for _, ask := range asks {
				if code, out, errOut := run(t, l.prog, nil, ask...); code != cli.ExitOK || out != help || errOut != "" {
					t.Fatalf("%v: exit %d, stderr %q, output differs from --help:\n%s", ask, code, errOut, out)
				}
			}
			flags := flagNames(t, l.cmd)
			if l.cmd.Logs {
				for _, n := range []string{"--log-level", "--log-format"} {
					if !strings.Contains(help, "  "+n+" ") {
						t.Fatalf("--help lacks %s", n)
					}
				}
			}
			for _, f := range flags {
				names := l.cmd.EnvNames(f.Name)
				if names[len(names)-1] != cli.EnvName(f.Name) {
					t.Fatalf("--%s reads %v, not the one rule's %s", f.Name, names, cli.EnvName(f.Name))
				}
				line := flagHelpLine(t, help, f.Name)
				if !strings.Contains(line, "(env "+names[0]) {
					t.Fatalf("--help lists --%s without (env %s first:\n%s", f.Name, names[0], line)
				}
				for _, env := range names {
					if !strings.Contains(line, env) {
						t.Fatalf("--help lists --%s without %s:\n%s", f.Name, env, line)
					}
				}
				for _, env := range names {
					v := validValue(t, f)
					args := []string{}
					for range l.cmd.NArgs {
						args = append(args, "arg")
					}
					fs, err := cli.Parse(l.prog, l.cmd, args, func(k string) string {
						if k == env {
							return v
						}
						return ""
					})
					if err != nil {
						t.Fatalf("%s=%s: %v", env, v, err)
					}
					if got := fs.Lookup(f.Name).Value.String(); got != v {
						t.Fatalf("%s=%s: --%s = %q, want the variable's value", env, v, f.Name, got)
					}
				}
			}
			code, out, errOut := run(t, l.prog, nil, l.argv("--bogus")...)
			if code != cli.ExitUsage || out != "" || strings.Count(errOut, "\n") != 1 ||
				!strings.HasPrefix(errOut, l.prog.Name+": flag provided but not defined: -bogus") {
				t.Fatalf("--bogus: exit %d, stdout %q, stderr %q", code, out, errOut)
			}
		})
	}
}

// A value the flag refuses, from the environment, is a usage error naming the
// variable.
func TestBadEnvironmentValueExits2(t *testing.T) {
	code, _, errOut := run(t, commands.Runner, map[string]string{"COMPASS_HEARTBEAT": "soon"})
	if code != cli.ExitUsage || errOut != "compass-runner: COMPASS_HEARTBEAT=soon: want a duration such as 30s\n" {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	code, _, errOut = run(t, commands.Callout, map[string]string{"COMPASS_MODE": "sideways"})
	if code != cli.ExitUsage || errOut != "compass-callout: COMPASS_MODE=sideways: want server-config or operator\n" {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
}

// programs() is every daemon: one program a directory under cmd/, so the
// tests that walk programs() (TestEveryFlagOfEveryCommand, TestVersion)
// cover each binary.
func TestProgramsAreEveryDaemon(t *testing.T) {
	entries, err := os.ReadDir(filepath.Join("..", "..", "..", "cmd"))
	if err != nil {
		t.Fatal(err)
	}
	var dirs, names []string
	for _, e := range entries {
		if e.IsDir() {
			dirs = append(dirs, e.Name())
		}
	}
	for _, p := range programs() {
		names = append(names, p.Name)
	}
	slices.Sort(dirs)
	slices.Sort(names)
	if !slices.Equal(dirs, names) || len(names) != 3 {
		t.Fatalf("programs() are %v; cmd/ has %v", names, dirs)
	}
}

// --version and "version" work on all three programs and print the build.
func TestVersion(t *testing.T) {
	for _, p := range programs() {
		for _, args := range [][]string{{"--version"}, {"version"}} {
			code, out, _ := run(t, p, nil, args...)
			b := cli.BuildInfo()
			want := fmt.Sprintf("%s %s (revision ", p.Name, b.Version)
			if code != cli.ExitOK || !strings.HasPrefix(out, want) || !strings.Contains(out, b.GoVersion) {
				t.Fatalf("%s %v: exit %d, %q; want it to start with %q", p.Name, args, code, out, want)
			}
		}
	}
	if code, out, _ := run(t, commands.Server, nil, "serve", "--version"); code != cli.ExitOK || !strings.HasPrefix(out, "compass-server ") {
		t.Fatalf("serve --version: exit %d, %q", code, out)
	}
	// The words themselves answer --help, and help names them: exit 0.
	for _, p := range programs() {
		for _, args := range [][]string{{"version", "--help"}, {"version", "-h"}, {"--version", "--help"}, {"help", "version"}} {
			code, out, errOut := run(t, p, nil, args...)
			if want := "Usage: " + p.Name + " version\n"; code != cli.ExitOK || !strings.HasPrefix(out, want) || errOut != "" {
				t.Fatalf("%s %v: exit %d, stdout %q, stderr %q; want exit 0 and %q", p.Name, args, code, out, errOut, want)
			}
		}
		for _, args := range [][]string{{"help", "help"}, {"help", "help", "--help"}} {
			code, out, errOut := run(t, p, nil, args...)
			if want := "Usage: " + p.Name + " help [command]\n"; code != cli.ExitOK || !strings.HasPrefix(out, want) || errOut != "" {
				t.Fatalf("%s %v: exit %d, stdout %q, stderr %q; want exit 0 and %q", p.Name, args, code, out, errOut, want)
			}
		}
		for _, args := range [][]string{{"help"}, {"--help"}, {"-h"}, {"help", "--help"}} {
			if code, out, errOut := run(t, p, nil, args...); code != cli.ExitOK || !strings.HasPrefix(out, "Usage: "+p.Name+" ") || errOut != "" {
				t.Fatalf("%s %v: exit %d, stdout %q, stderr %q", p.Name, args, code, out, errOut)
			}
		}
	}
}

// Usage errors of the multi-command program exit 2: no command, an unknown
// one, help for an unknown one, a missing or extra argument.
func TestServerUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "compass-server: a command is required (see compass-server --help)\n"},
		{[]string{"frobnicate"}, "compass-server: unknown command \"frobnicate\" (see compass-server --help)\n"},
		{[]string{"help", "frobnicate"}, "compass-server: help: unknown command \"frobnicate\" (see compass-server --help)\n"},
		{[]string{"revoke-token"}, "compass-server: want TOKEN_ID (see compass-server revoke-token --help)\n"},
		{[]string{"list-tokens", "extra"}, "compass-server: unexpected argument \"extra\" (see compass-server list-tokens --help)\n"},
		{[]string{"serve", "--log-format", "xml"}, "compass-server: --log-format xml: want json or text\n"},
	} {
		code, out, errOut := run(t, commands.Server, nil, tc.args...)
		if code != cli.ExitUsage || out != "" || errOut != tc.want {
			t.Fatalf("%v: exit %d, stdout %q, stderr %q; want exit 2 and %q", tc.args, code, out, errOut, tc.want)
		}
	}
}

// The Runner refuses bad starts with exit 2 and a message that names the
// cause, never the token.
func TestRunnerStartRefusals(t *testing.T) {
	dir := t.TempDir()
	tokenDir := filepath.Join(dir, "secrets")
	if err := os.Mkdir(tokenDir, 0o700); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(tokenDir, "token")
	if err := os.WriteFile(path, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	nats := []string{"--nats-url", "nats://127.0.0.1:1", "--health-addr", ""}
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"both token sources", append([]string{"--token-file", path, "--runner-id", "r1"}, nats...), map[string]string{"COMPASS_RUNNER_TOKEN": "minted-secret"}, runner.ErrBothTokens.Error()},
		{"both token sources by COMPASS_RUNNER_TOKEN_FILE", append([]string{"--runner-id", "r1"}, nats...), map[string]string{"COMPASS_RUNNER_TOKEN_FILE": path, "COMPASS_RUNNER_TOKEN": "minted-secret"}, runner.ErrBothTokens.Error()},
		{"both token sources by COMPASS_TOKEN_FILE", append([]string{"--runner-id", "r1"}, nats...), map[string]string{"COMPASS_TOKEN_FILE": path, "COMPASS_RUNNER_TOKEN": "minted-secret"}, runner.ErrBothTokens.Error()},
		{"mount over the token directory by COMPASS_RUNNER_TOKEN_FILE", append([]string{"--runner-id", "r1", "--mount", tokenDir + ":/mnt"}, nats...), map[string]string{"COMPASS_RUNNER_TOKEN_FILE": path}, runner.ErrMountOverToken.Error()},
		{"COMPASS_RUNNER_TOKEN_FILE and COMPASS_TOKEN_FILE differ", append([]string{"--runner-id", "r1"}, nats...), map[string]string{"COMPASS_RUNNER_TOKEN_FILE": path, "COMPASS_TOKEN_FILE": path + ".other", "COMPASS_RUNNER_TOKEN": "minted-secret"}, "COMPASS_RUNNER_TOKEN_FILE and COMPASS_TOKEN_FILE are both set, to different values"},
		{"mount over the token directory", append([]string{"--token-file", path, "--runner-id", "r1", "--mount", tokenDir + ":/mnt"}, nats...), nil, runner.ErrMountOverToken.Error()},
		{"mount of an ancestor", append([]string{"--token-file", path, "--runner-id", "r1", "--mount", dir + ":/mnt"}, nats...), nil, runner.ErrMountOverToken.Error()},
		{"relative mount", append([]string{"--token-file", path, "--runner-id", "r1", "--mount", "data:/mnt"}, nats...), nil, runner.ErrBadMount.Error()},
		{"no token", append([]string{"--runner-id", "r1"}, nats...), nil, runner.ErrNoToken.Error()},
		{"no server and no NATS URL", []string{"--token-file", path, "--runner-id", "r1", "--health-addr", ""}, nil, "set --server (COMPASS_SERVER) to enroll"},
		{"plaintext server", []string{"--token-file", path, "--server", "http://server:8443", "--health-addr", ""}, nil, "must be https://"},
		{"static token without runner ID", nats, map[string]string{"COMPASS_RUNNER_TOKEN": "minted-secret"}, "--runner-id is required"},
		{"invalid runner ID", append([]string{"--token-file", path, "--runner-id", "a.b"}, nats...), nil, "--runner-id"},
		{"no reconnect jitter", append([]string{"--token-file", path, "--runner-id", "r1", "--reconnect-jitter", "0s"}, nats...), nil, "--reconnect-jitter 0s: want a positive duration"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, errOut := runStopped(t, commands.Runner, tc.env, tc.args...)
			if code != cli.ExitUsage || !strings.HasPrefix(errOut, "compass-runner: ") || !strings.Contains(errOut, tc.want) || strings.Contains(errOut, "minted-secret") {
				t.Fatalf("exit %d, stderr %q; want exit 2 with %q and no token", code, errOut, tc.want)
			}
		})
	}
}

// compass-callout checks its configuration before touching anything, and a
// secret given twice is refused without showing it.
func TestCalloutConfigRefusals(t *testing.T) {
	base := []string{"--issuer-seed-file", "x", "--runner-clusters", "c"}
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"no issuer", []string{"--account", "A", "--runner-clusters", "c"}, nil, "--issuer-seed-file is required"},
		{"no account in server-config mode", base, nil, "--account (the Runners' account name) is required in server-config mode"},
		{"operator without user signer", append(base, "--mode", "operator"), nil, "--user-signing-seed-file is required in operator mode"},
		{"two credentials", append(base, "--account", "A", "--nats-creds", "a", "--nats-nkey", "b"), nil, "set one of --nats-creds, --nats-nkey and --nats-user"},
		{"user without password", append(base, "--account", "A", "--nats-user", "u"), nil, "--nats-user needs --nats-password-file or COMPASS_NATS_PASSWORD"},
		{"password twice", append(base, "--account", "A", "--nats-user", "u", "--nats-password-file", "/nonexistent"), map[string]string{"COMPASS_NATS_PASSWORD": "hunter2"}, "set --nats-password-file or COMPASS_NATS_PASSWORD, not both"},
		{"nothing to accept", []string{"--issuer-seed-file", "x", "--account", "A"}, nil, "nothing to accept: set --runner-clusters, --database-url or both"},
		{"too many connections", append(base, "--account", "A", "--connections", "1000"), nil, "--connections 1000: want 1 to 64"},
		{"answer horizon below the floor", append(base, "--account", "A", "--answer-horizon", "50ms"), nil, "--answer-horizon 50ms: want at least 100ms"},
		{"stray argument", append(base, "--account", "A", "extra"), nil, `unexpected argument "extra"`},
		{"no kick identity", append(base, "--account", "A"), nil, "no kick identity: set --kick-creds, --kick-nkey or --kick-user"},
		{"kick password twice", append(base, "--account", "A", "--kick-user", "k", "--kick-password-file", "/nonexistent"), map[string]string{"COMPASS_KICK_PASSWORD": "hunter2"}, "set --kick-password-file or COMPASS_KICK_PASSWORD, not both"},
		{"unknown duplicates policy", append(base, "--account", "A", "--duplicates", "both"), nil, "want kick-older or keep"},
		{"user JWT lifetime past the maximum", append(base, "--account", "A", "--no-kick", "--max-user-jwt-lifetime", "2h"), nil, "--max-user-jwt-lifetime 2h0m0s: want 2s to 1h0m0s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, errOut := run(t, commands.Callout, tc.env, tc.args...)
			if code != cli.ExitUsage || errOut != "" && !strings.HasPrefix(errOut, "compass-callout: ") || !strings.Contains(errOut, tc.want) || strings.Contains(errOut, "hunter2") {
				t.Fatalf("exit %d, stderr %q; want exit 2 with %q", code, errOut, tc.want)
			}
		})
	}
}
