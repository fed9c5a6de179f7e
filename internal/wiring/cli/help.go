package cli

import (
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
)

// Help and version: the words every program answers (help, --help,
// version, --version) and the usage text they print.

// route picks the command args name and handles the program-level words:
// help, version, --help, --version. A nil command means it was handled.
// "help" and "version" answer --help like any command, and help names them
// too, so every way of asking for help exits 0.
func route(prog *Command, args []string, stdout io.Writer) (*Command, []string, error) {
	if len(args) > 0 {
		switch args[0] {
		case "help":
			return nil, nil, help(stdout, prog, args[1:])
		case "-version", "--version", "version":
			return nil, nil, versionWord(stdout, prog, args[0], args[1:])
		}
	}
	if len(prog.Subcommands) == 0 {
		return prog, args, nil
	}
	if len(args) == 0 {
		return nil, nil, UsageError(fmt.Errorf("a command is required (see %s --help)", prog.Name))
	}
	switch args[0] {
	case "-h", "-help", "--help":
		printProgram(stdout, prog)
		return nil, nil, nil
	}
	c := find(prog, args[0])
	if c == nil {
		return nil, nil, UsageError(fmt.Errorf("unknown command %q (see %s --help)", args[0], prog.Name))
	}
	return c, args[1:], nil
}

// isHelpFlag reports whether a is one of the spellings of --help.
func isHelpFlag(a string) bool {
	switch a {
	case "-h", "-help", "--help", "--h":
		return true
	}
	return false
}

// withoutHelpFlags is args without --help and its spellings: "help serve
// --help" asks for the same as "help serve".
func withoutHelpFlags(args []string) (rest []string, asked bool) {
	for _, a := range args {
		if isHelpFlag(a) {
			asked = true
			continue
		}
		rest = append(rest, a)
	}
	return rest, asked
}

const helpWordHelp = `Prints the program's help, or a command's: "%[1]s help <command>" prints
what "%[1]s <command> --help" prints.`

const versionWordHelp = `Prints the program's version: the module version, the VCS revision and the Go
version it was built with. --version on any command prints the same.`

// help is "help [command]".
func help(stdout io.Writer, prog *Command, args []string) error {
	args, _ = withoutHelpFlags(args)
	if len(args) == 0 {
		if len(prog.Subcommands) == 0 {
			printUsage(stdout, prog, prog)
		} else {
			printProgram(stdout, prog)
		}
		return nil
	}
	if len(args) == 1 {
		switch args[0] {
		case "help":
			fmt.Fprintf(stdout, "Usage: %s help [command]\n\n%s\n", prog.Name, fmt.Sprintf(helpWordHelp, prog.Name))
			return nil
		case "version":
			fmt.Fprintf(stdout, "Usage: %s version\n\n%s\n", prog.Name, versionWordHelp)
			return nil
		}
		if c := find(prog, args[0]); c != nil {
			printUsage(stdout, prog, c)
			return nil
		}
	}
	return UsageError(fmt.Errorf("help: unknown command %q (see %s --help)", strings.Join(args, " "), prog.Name))
}

// versionWord is "version" (or --version) at the program's level; with
// --help it explains itself.
func versionWord(stdout io.Writer, prog *Command, word string, args []string) error {
	rest, asked := withoutHelpFlags(args)
	switch {
	case len(rest) > 0:
		return UsageError(fmt.Errorf("%s takes no arguments", word))
	case asked:
		return help(stdout, prog, []string{"version"})
	}
	PrintVersion(stdout, prog.Name)
	return nil
}

func find(prog *Command, name string) *Command {
	for _, c := range prog.Subcommands {
		if c.Name == name {
			return c
		}
	}
	return nil
}

func usageName(prog, cmd *Command) string {
	if prog == cmd {
		return prog.Name
	}
	return prog.Name + " " + cmd.Name
}

// printProgram prints a program's help with its command list.
func printProgram(w io.Writer, prog *Command) {
	fmt.Fprintf(w, "Usage: %s <command> [flags] [args]\n\n%s\n\nCommands:\n", prog.Name, strings.TrimSpace(prog.Help))
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	for _, c := range prog.Subcommands {
		fmt.Fprintf(tw, "  %s\t%s\n", c.Name, c.Summary)
	}
	fmt.Fprintf(tw, "  help [command]\tprint this help, or a command's\n")
	fmt.Fprintf(tw, "  version\tprint the version\n")
	_ = tw.Flush()
	fmt.Fprintf(w, "\nEvery flag not given falls back to the environment variable COMPASS_<FLAG_NAME>\n(--nats-url -> %s). \"%s help <command>\" explains a command.\n", EnvName("nats-url"), prog.Name)
}

// printUsage prints a command's help: the usage line, the explanation, and
// every flag with the environment variable it falls back to.
func printUsage(w io.Writer, prog, cmd *Command) {
	fmt.Fprintf(w, "Usage: %s [flags]", usageName(prog, cmd))
	if cmd.Args != "" {
		fmt.Fprintf(w, " %s", cmd.Args)
	}
	fmt.Fprintf(w, "\n\n%s\n", strings.TrimSpace(cmd.Help))
	fs := newFlagSet(cmd).fs
	fmt.Fprintf(w, "\nFlags (a flag not given falls back to its environment variable):\n")
	var flags []*flag.Flag
	fs.VisitAll(func(f *flag.Flag) { flags = append(flags, unwrap(f)) })
	sort.Slice(flags, func(i, j int) bool { return flags[i].Name < flags[j].Name })
	for _, f := range flags {
		fmt.Fprintf(w, "  --%s", f.Name)
		name, usage := flag.UnquoteUsage(f)
		if e, ok := f.Value.(*Enum); ok {
			name = strings.Join(e.Choices(), "|")
		}
		if name != "" {
			fmt.Fprintf(w, " %s", name)
		}
		if f.Name != "version" {
			fmt.Fprintf(w, "  (env %s)", strings.Join(cmd.EnvNames(f.Name), " or "))
		}
		fmt.Fprintf(w, "\n      %s", strings.ReplaceAll(usage, "\n", "\n      "))
		switch f.DefValue {
		case "", "0", "0s", "false", "[]":
		default:
			fmt.Fprintf(w, " (default %q)", f.DefValue)
		}
		fmt.Fprintln(w)
	}
	var only []EnvVar
	for _, e := range cmd.Env {
		if e.Flag == "" {
			only = append(only, e)
		}
	}
	if len(only) > 0 {
		fmt.Fprintf(w, "\nEnvironment only (secrets are never flags):\n")
		tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
		for _, e := range only {
			fmt.Fprintf(tw, "  %s\t%s\n", e.Name, e.Usage)
		}
		_ = tw.Flush()
	}
}
