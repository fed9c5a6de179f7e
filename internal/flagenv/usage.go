package flagenv

import (
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
)

// PrintFlags writes every flag of fs in name order: its name and value type,
// the environment variable it falls back to (envOf returns "" for a flag with
// none), its usage indented, and its default unless that is a zero value.
func PrintFlags(w io.Writer, fs *flag.FlagSet, envOf func(flagName string) string) {
	var flags []*flag.Flag
	fs.VisitAll(func(f *flag.Flag) { flags = append(flags, f) })
	sort.Slice(flags, func(i, j int) bool { return flags[i].Name < flags[j].Name })
	for _, f := range flags {
		fmt.Fprintf(w, "  --%s", f.Name)
		name, usage := flag.UnquoteUsage(f)
		if name != "" {
			fmt.Fprintf(w, " %s", name)
		}
		if env := envOf(f.Name); env != "" {
			fmt.Fprintf(w, "  (env %s)", env)
		}
		fmt.Fprintf(w, "\n      %s", strings.ReplaceAll(usage, "\n", "\n      "))
		switch f.DefValue {
		case "", "0", "0s", "false":
		default:
			fmt.Fprintf(w, " (default %q)", f.DefValue)
		}
		fmt.Fprintln(w)
	}
}
