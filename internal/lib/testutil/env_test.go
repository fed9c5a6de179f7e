package testutil

import (
	"fmt"
	"strings"
	"testing"
)

// EnvInt takes a positive integer, defaults when unset, and refuses
// anything else by the variable's name.
func TestEnvIntTakesAPositiveIntegerOrTheDefault(t *testing.T) {
	const name = "COMPASS_TESTUTIL_KNOB"
	t.Setenv(name, "")
	if got := EnvInt(t, name, 7); got != 7 {
		t.Fatalf("unset: %d, want the default 7", got)
	}
	t.Setenv(name, "42")
	if got := EnvInt(t, name, 7); got != 42 {
		t.Fatalf("42: %d", got)
	}
	for _, bad := range []string{"0", "-3", "many"} {
		t.Setenv(name, bad)
		r := &recorder{TB: t}
		func() {
			defer func() { _ = recover() }()
			EnvInt(r, name, 7)
		}()
		if want := name + `="` + bad + `": want a positive integer`; !strings.Contains(r.msg, want) {
			t.Fatalf("%q: failure %q, want %q", bad, r.msg, want)
		}
	}
}

// recorder keeps a Fatalf's message and stops the call, as t.Fatalf would.
type recorder struct {
	testing.TB
	msg string
}

func (r *recorder) Helper() {}

func (r *recorder) Fatalf(format string, args ...any) {
	r.msg = fmt.Sprintf(format, args...)
	panic("fatal")
}
