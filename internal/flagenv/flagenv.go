// Package flagenv gives the commands' flags the project's precedence: a flag
// given on the command line wins, then its COMPASS_* environment variable,
// then its default.
package flagenv

import (
	"flag"
	"fmt"
	"slices"
)

// Apply sets every flag in envOf (flag name -> environment variable) that was
// not given on the command line from its variable, when that is non-empty.
// Flags are visited in name order, so the first error is always the same one;
// it names the variable.
func Apply(fs *flag.FlagSet, envOf map[string]string, getenv func(string) string) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	names := make([]string, 0, len(envOf))
	for name := range envOf {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		env := envOf[name]
		if v := getenv(env); v != "" && !given[name] {
			if err := fs.Set(name, v); err != nil {
				return fmt.Errorf("%s: %w", env, err)
			}
		}
	}
	return nil
}
