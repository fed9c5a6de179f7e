package server

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/compass-runner/identity/internal/flagenv"
)

// envName is the environment variable that stands in for a flag that was not
// given: COMPASS_ and the flag's name in upper snake case (--nats-url ->
// COMPASS_NATS_URL).
func envName(flagName string) string {
	return "COMPASS_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// command is one subcommand: its flags, its help and what it runs.
type command struct {
	name    string
	args    string // positional arguments in the usage line, e.g. "ID"
	summary string // one line, for the command list
	help    string // paragraphs after the usage line
	noEnv   map[string]bool
	envAs   map[string]string // flag -> environment variable, where not envName(flag)
	fs      *flag.FlagSet
	nargs   int // exact number of positional arguments
}

func newCommand(name, args, summary, help string, nargs int) *command {
	c := &command{name: name, args: args, summary: summary, help: help, nargs: nargs,
		fs: flag.NewFlagSet(name, flag.ContinueOnError), noEnv: map[string]bool{}, envAs: map[string]string{}}
	return c
}

// envOf is the environment variable a flag falls back to.
func (c *command) envOf(flagName string) string {
	if e, ok := c.envAs[flagName]; ok {
		return e
	}
	return envName(flagName)
}

// usage prints the command's help: usage line, explanation, flags with the
// environment variable each falls back to.
func (c *command) usage(w io.Writer) {
	fmt.Fprintf(w, "Usage: compass-server %s [flags]", c.name)
	if c.args != "" {
		fmt.Fprintf(w, " %s", c.args)
	}
	fmt.Fprintf(w, "\n\n%s\n", strings.TrimSpace(c.help))
	n := 0
	c.fs.VisitAll(func(*flag.Flag) { n++ })
	if n == 0 {
		return
	}
	fmt.Fprintf(w, "\nFlags (a flag not given falls back to its environment variable):\n")
	flagenv.PrintFlags(w, c.fs, func(name string) string {
		if c.noEnv[name] {
			return ""
		}
		return c.envOf(name)
	})
}

// errHelp is returned when --help was asked for and printed.
var errHelp = flag.ErrHelp

// parse parses flags, then fills every flag not given from its COMPASS_*
// environment variable, then checks the positional arguments.
func (c *command) parse(args []string, getenv func(string) string, stderr io.Writer) ([]string, error) {
	c.fs.SetOutput(io.Discard)
	// Flags may come before or after positional arguments ("ping-runner ID
	// --server URL").
	var rest []string
	for {
		if err := c.fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				c.usage(stderr)
				return nil, errHelp
			}
			return nil, usageErr(fmt.Errorf("%s: %w (see compass-server %s --help)", c.name, err, c.name))
		}
		args = c.fs.Args()
		if len(args) == 0 {
			break
		}
		rest = append(rest, args[0])
		args = args[1:]
	}
	envOf := map[string]string{}
	c.fs.VisitAll(func(f *flag.Flag) {
		if !c.noEnv[f.Name] {
			envOf[f.Name] = c.envOf(f.Name)
		}
	})
	if err := flagenv.Apply(c.fs, envOf, getenv); err != nil {
		return nil, usageErr(fmt.Errorf("%s: %w", c.name, err))
	}
	if c.nargs >= 0 && len(rest) != c.nargs {
		if c.nargs == 0 {
			return nil, usageErr(fmt.Errorf("%s: unexpected argument %q (see compass-server %s --help)", c.name, rest[0], c.name))
		}
		return nil, usageErr(fmt.Errorf("%s: want %s (see compass-server %s --help)", c.name, c.args, c.name))
	}
	return rest, nil
}
