package testutil

import (
	"os"
	"strconv"
	"testing"
)

// EnvInt is a harness knob: the positive integer in the environment
// variable name, or def when it is unset; anything else fails t, naming the
// variable. The knobs keep a harness's command line plain `go test`.
func EnvInt(t testing.TB, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		t.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}
