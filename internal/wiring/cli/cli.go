// Package cli is the one command-line toolkit of the project's three daemons
// and their subcommands, so they behave alike:
//
//   - every flag not given on the command line falls back to the environment
//     variable COMPASS_<FLAG_NAME> (--nats-url -> COMPASS_NATS_URL), by that
//     one rule; where a design record fixes another name for a flag's
//     variable, the command declares it (EnvVar.Flag) and the record's name
//     wins: --help lists it, and COMPASS_<FLAG_NAME> is still read beside it;
//     secrets are never flags, only files or environment-only variables read
//     through Secret;
//   - --help, -h and "help [command]" print the help on stdout and exit 0,
//     and so do "help help", "help version" and "version --help";
//   - a usage error (unknown flag or command, bad value, missing or extra
//     argument) prints one line on stderr and exits 2; a failure exits 1;
//   - a refused value says what was wrong and what is accepted, naming the
//     flag as given or the variable that set it ("--heartbeat 5: want a
//     duration such as 30s", "COMPASS_HEARTBEAT=5: ..."), by one rule for
//     every flag type (values.go); an error a command returns that names a
//     flag set from the environment ends with the variable's name;
//   - --version and "version" print the build (module version, VCS revision,
//     Go version);
//   - --log-format json|text (JSON by default) and --log-level on every
//     command that logs, with durations logged in seconds.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
)

// Exit codes.
const (
	ExitOK      = 0
	ExitFailure = 1
	ExitUsage   = 2
)

// EnvPrefix starts every environment variable the commands read.
const EnvPrefix = "COMPASS_"

// EnvName is the environment variable a flag falls back to: COMPASS_ and the
// flag's name in upper snake case.
func EnvName(flagName string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// EnvVar is an environment variable a command reads besides the one rule's.
//
// Without Flag it is environment-only (a secret: secrets are never flags),
// listed with Usage in --help.
//
// With Flag it is the name a design record fixes for that flag's variable
// (DL-440's COMPASS_RUNNER_TOKEN_FILE for compass-runner --token-file). The
// record wins over the one rule: --help lists it as the flag's variable, and
// the flag falls back to it. COMPASS_<FLAG_NAME> is still read, so users of
// the toolkit's spelling keep working; both set to different values is a
// usage error naming both variables (never their values). A flag given on
// the command line wins over both.
type EnvVar struct {
	Name  string
	Usage string // for an environment-only variable
	Flag  string // the flag it is the record's name for; empty when environment-only
}

// Command is a program (when it has no Subcommands, or as their parent) or
// one of its subcommands.
type Command struct {
	// Name is the program's name, or the subcommand's.
	Name string
	// Args names the positional arguments in the usage line ("RUNNER_ID").
	Args string
	// NArgs is the exact number of positional arguments.
	NArgs int
	// Summary is one line, for the parent's command list.
	Summary string
	// Help is the explanation printed after the usage line.
	Help string
	// Env lists the environment-only variables the command reads, and the
	// names a design record fixes for its flags' variables (EnvVar.Flag).
	Env []EnvVar
	// Logs adds --log-level and --log-format, and builds Invocation.Log.
	Logs bool
	// Flags registers the command's flags on fs and returns what runs once
	// they are parsed (values from the command line, then the environment).
	Flags func(fs *flag.FlagSet) RunFunc
	// Subcommands of a program that has them (Flags is then nil).
	Subcommands []*Command
}

// EnvNames lists the variables flag flagName falls back to, the one that
// wins first: the names a design record fixes for it (EnvVar.Flag), then
// COMPASS_<FLAG_NAME> by the one rule.
func (c *Command) EnvNames(flagName string) []string {
	rule := EnvName(flagName)
	var names []string
	for _, e := range c.Env {
		if e.Flag == flagName && e.Name != rule {
			names = append(names, e.Name)
		}
	}
	return append(names, rule)
}

// RunFunc runs a parsed command.
type RunFunc func(ctx context.Context, in *Invocation) error

// Invocation is what a running command gets besides its flags.
type Invocation struct {
	Program string   // the program's name
	Args    []string // positional arguments
	Getenv  func(string) string
	Stdout  io.Writer
	Stderr  io.Writer
	Log     *slog.Logger // set when the command logs (Command.Logs)

	values map[string]*sourced // the command's flags, by name
}

// BadValue is the usage error of a flag value the command refuses after
// parsing (a --ttl under the minimum), in the toolkit's one form: the flag
// or the environment variable that set it, the value as given, and reason,
// which says what was wrong and what is accepted:
//
//	--ttl 0s: must be positive
//	COMPASS_TTL=0s: must be positive
//
// The value is shown whole: never use it for a flag whose value may hold a
// credential (a URL with a password in it).
func (in *Invocation) BadValue(name, reason string) error {
	return UsageError(in.ValueError(name, reason, nil))
}

// ValueError is BadValue's error before it is marked a usage error, for a
// value refused by what it names rather than by its form (a --to file that
// exists): the command fails with exit 1. err is its cause, for errors.Is.
func (in *Invocation) ValueError(name, reason string, err error) *ValueError {
	ve := &ValueError{Source: "--" + name, Reason: reason, Whole: true, Err: err}
	if s, ok := in.values[name]; ok {
		ve.Value = s.Value.String()
		if s.from != "" {
			ve.Source, ve.Value = s.from, s.given
		}
	}
	return ve
}

// errUsage marks an error in how a command was called.
var errUsage = errors.New("usage error")

// UsageError marks err as a usage error: the program prints it and exits 2.
func UsageError(err error) error {
	if err == nil {
		return nil
	}
	return usage{err}
}

type usage struct{ err error }

func (u usage) Error() string        { return u.err.Error() }
func (u usage) Unwrap() []error      { return []error{errUsage, u.err} }
func (u usage) Is(target error) bool { return target == errUsage }

// IsUsage reports whether err is a usage error.
func IsUsage(err error) bool { return errors.Is(err, errUsage) }

// Main runs prog with the process's arguments, environment and standard
// streams until SIGINT or SIGTERM, and returns the exit code. SIGHUP never
// stops the process: it is ignored unless a component subscribes to it (the
// cluster-file reload does).
func Main(prog *Command) int {
	signal.Ignore(syscall.SIGHUP)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	return Run(ctx, prog, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
}

// Run runs prog with args (without the program's name) and returns the exit
// code.
func Run(ctx context.Context, prog *Command, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	cmd, rest, err := route(prog, args, stdout)
	if err == nil && cmd != nil {
		err = execute(ctx, prog, cmd, rest, getenv, stdout, stderr)
	}
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return ExitOK
	case IsUsage(err):
		fmt.Fprintf(stderr, "%s: %v\n", prog.Name, err)
		return ExitUsage
	default:
		fmt.Fprintf(stderr, "%s: %v\n", prog.Name, err)
		return ExitFailure
	}
}

// parsed is a command's flag set after parsing.
type parsed struct {
	fs     *flag.FlagSet
	run    RunFunc
	log    *logFlags
	rest   []string
	ver    bool
	values map[string]*sourced
}

// Parse parses args and the environment for cmd, as Run does, without
// running it. It returns the flag set, for tests that walk every flag.
func Parse(prog, cmd *Command, args []string, getenv func(string) string) (*flag.FlagSet, error) {
	p, err := parse(prog, cmd, args, getenv, io.Discard)
	if err != nil {
		return nil, err
	}
	return p.fs, nil
}

// flagSet is a command's flag set as newFlagSet builds it: every Value
// wrapped (sourced), the first refusal kept in first.
type flagSet struct {
	fs     *flag.FlagSet
	run    RunFunc
	log    *logFlags
	ver    *bool
	values map[string]*sourced
	first  *error
}

func newFlagSet(cmd *Command) flagSet {
	fs := flag.NewFlagSet(cmd.Name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var run RunFunc
	if cmd.Flags != nil {
		run = cmd.Flags(fs)
	}
	var lf *logFlags
	if cmd.Logs {
		lf = &logFlags{}
		lf.register(fs)
	}
	ver := new(bool)
	fs.BoolVar(ver, "version", false, "print the version and exit")
	for _, e := range cmd.Env {
		if e.Flag != "" && (e.Flag == "version" || fs.Lookup(e.Flag) == nil) {
			panic(fmt.Sprintf("cli: %s: %s names no flag --%s", cmd.Name, e.Name, e.Flag))
		}
	}
	values, first := wrapValues(fs)
	return flagSet{fs: fs, run: run, log: lf, ver: ver, values: values, first: first}
}

func parse(prog, cmd *Command, args []string, getenv func(string) string, stdout io.Writer) (*parsed, error) {
	set := newFlagSet(cmd)
	fs, ver := set.fs, set.ver
	// Flags may come before or after positional arguments
	// ("ping-runner ID --server URL").
	var rest []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				printUsage(stdout, prog, cmd)
				return nil, flag.ErrHelp
			}
			if *set.first != nil {
				// A value refused: the one rule's message says what is
				// accepted, instead of the flag package's "parse error".
				return nil, UsageError(*set.first)
			}
			return nil, UsageError(fmt.Errorf("%s (see %s --help)", err, usageName(prog, cmd)))
		}
		args = fs.Args()
		if len(args) == 0 {
			break
		}
		rest = append(rest, args[0])
		args = args[1:]
	}
	if *ver {
		return &parsed{fs: fs, ver: true}, nil
	}
	if err := applyEnv(cmd, fs, set.values, getenv); err != nil {
		return nil, UsageError(err)
	}
	if len(rest) != cmd.NArgs {
		if cmd.NArgs == 0 {
			return nil, UsageError(fmt.Errorf("unexpected argument %q (see %s --help)", rest[0], usageName(prog, cmd)))
		}
		return nil, UsageError(fmt.Errorf("want %s (see %s --help)", cmd.Args, usageName(prog, cmd)))
	}
	return &parsed{fs: fs, run: set.run, log: set.log, rest: rest, values: set.values}, nil
}

// applyEnv sets every flag not given on the command line from its
// environment variables (cmd.EnvNames), those that are non-empty, in name
// order so the first error is always the same one; a refused value is a
// ValueError naming the variable. Two of a flag's variables set to different
// values is an error naming both, never their values.
func applyEnv(cmd *Command, fs *flag.FlagSet, values map[string]*sourced, getenv func(string) string) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if err != nil || given[f.Name] || f.Name == "version" {
			return
		}
		var env, v string
		for _, name := range cmd.EnvNames(f.Name) {
			switch val := getenv(name); {
			case val == "":
			case env == "":
				env, v = name, val
			case val != v:
				err = fmt.Errorf("%s and %s are both set, to different values; --%s takes one: set %s only", env, name, f.Name, env)
				return
			}
		}
		if env != "" {
			values[f.Name].source = env
			err = fs.Set(f.Name, v)
		}
	})
	return err
}

func execute(ctx context.Context, prog, cmd *Command, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	p, err := parse(prog, cmd, args, getenv, stdout)
	if err != nil {
		return err
	}
	if p.ver {
		PrintVersion(stdout, prog.Name)
		return nil
	}
	in := &Invocation{Program: prog.Name, Args: p.rest, Getenv: getenv, Stdout: stdout, Stderr: stderr, values: p.values}
	if p.log != nil {
		if in.Log, err = p.log.logger(stderr); err != nil {
			return err
		}
	}
	if p.run == nil {
		return nil
	}
	return noteSources(p.run(ctx, in), p.values)
}

// noteSources adds to err, which a command or a library wrote in terms of
// flags ("--server must be an https:// URL"), the environment variables that
// set the flags it names: an operator who never typed --server learns to
// look at COMPASS_SERVER. Names only, never values. A ValueError already
// names its source.
func noteSources(err error, values map[string]*sourced) error {
	var ve *ValueError
	if err == nil || errors.As(err, &ve) {
		return err
	}
	msg := err.Error()
	var notes []string
	for _, name := range sortedNames(values) {
		s := values[name]
		if s.from == "" || strings.HasPrefix(s.from, "--") || !mentions(msg, "--"+name) {
			continue
		}
		if len(notes) == 0 {
			notes = append(notes, fmt.Sprintf("--%s was read from %s", name, s.from))
		} else {
			notes = append(notes, fmt.Sprintf("--%s from %s", name, s.from))
		}
	}
	if len(notes) == 0 {
		return err
	}
	return fmt.Errorf("%w (%s)", err, strings.Join(notes, ", "))
}

func sortedNames(values map[string]*sourced) []string {
	names := make([]string, 0, len(values))
	for n := range values {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// mentions reports whether msg names flag (--server) as a whole word: not
// --server-image.
func mentions(msg, flag string) bool {
	for i := 0; ; {
		j := strings.Index(msg[i:], flag)
		if j < 0 {
			return false
		}
		start, end := i+j, i+j+len(flag)
		if (start == 0 || !flagChar(msg[start-1])) && (end == len(msg) || !flagChar(msg[end])) {
			return true
		}
		i = end
	}
}

func flagChar(c byte) bool {
	return c == '-' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}
