package subjects

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

func TestValidSubjectToken(t *testing.T) {
	good := []string{"prod-eks/ip-10-0-1-5_ec2_internal", "build-host-1", "a", "ü"}
	for _, s := range good {
		if err := ValidSubjectToken(s); err != nil {
			t.Errorf("ValidSubjectToken(%q) = %v", s, err)
		}
		// The NATS server agrees that the token makes a literal subject.
		if !server.IsValidLiteralSubject("compass.runner." + s + ".cmd") {
			t.Errorf("nats-server refuses a subject built from %q", s)
		}
	}
	bad := map[string]error{
		"": ErrEmpty, ".": ErrInvalid, "a.b": ErrInvalid, "*": ErrInvalid, ">": ErrInvalid, "a>": ErrInvalid,
		" ": ErrInvalid, "a b": ErrInvalid, "a\tb": ErrInvalid, "a\nb": ErrInvalid, "a\x00": ErrInvalid,
		"a\x7f": ErrInvalid, "\xff": ErrInvalid, "a\u00a0b": ErrInvalid, "a\u2028": ErrInvalid,
	}
	for s, want := range bad {
		if err := ValidSubjectToken(s); !errors.Is(err, want) {
			t.Errorf("ValidSubjectToken(%q) = %v, want %v", s, err, want)
		}
	}
}

func TestBuilders(t *testing.T) {
	const id = "prod-eks/ip-10-0-1-5_ec2_internal"
	must := func(s string, err error) string {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	if got := must(Command(id)); got != "compass.runner.prod-eks/ip-10-0-1-5_ec2_internal.cmd" {
		t.Errorf("Command = %q", got)
	}
	if got := must(Event(id, "heartbeat")); got != "compass.runner."+id+".evt.heartbeat" {
		t.Errorf("Event = %q", got)
	}
	if got := must(Event(id, "container.started")); got != "compass.runner."+id+".evt.container.started" {
		t.Errorf("Event = %q", got)
	}
	if got := must(Events(id)); got != "compass.runner."+id+".evt.>" {
		t.Errorf("Events = %q", got)
	}
	if got := must(InboxPrefix(id)); got != "compass.runner."+id+".inbox" {
		t.Errorf("InboxPrefix = %q", got)
	}
	for _, name := range []string{"", "a..b", "*", "a.>", ".a"} {
		if _, err := Event(id, name); err == nil {
			t.Errorf("Event(%q) accepted", name)
		}
	}
	for _, bad := range []string{"", "a.b", "*", ">", "a b"} {
		if _, err := Command(bad); err == nil {
			t.Errorf("Command(%q) accepted", bad)
		}
		if _, err := RunnerPermissions(bad); err == nil {
			t.Errorf("RunnerPermissions(%q) accepted", bad)
		}
	}
	if got, ok := RunnerIDFromSubject("compass.runner." + id + ".evt.heartbeat"); !ok || got != id {
		t.Errorf("RunnerIDFromSubject = %q, %v", got, ok)
	}
	for _, s := range []string{"compass.runner", "compass.runner.x", "other.runner.x.cmd", "compass.runner.*.cmd"} {
		if _, ok := RunnerIDFromSubject(s); ok {
			t.Errorf("RunnerIDFromSubject(%q) accepted", s)
		}
	}
	if !server.IsValidSubject(AllEvents) {
		t.Errorf("AllEvents %q is not a valid subject", AllEvents)
	}
}

// The permissions are exactly the scheme: nothing more.
func TestRunnerPermissions(t *testing.T) {
	p, err := RunnerPermissions("prod/n1")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(p.Publish, []string{"compass.runner.prod/n1.evt.>"}) {
		t.Errorf("publish = %q", p.Publish)
	}
	if !slices.Equal(p.Subscribe, []string{"compass.runner.prod/n1.cmd", "compass.runner.prod/n1.inbox.>"}) {
		t.Errorf("subscribe = %q", p.Subscribe)
	}
	if p.ReplyMax != 1 || p.ReplyTTL != time.Minute || ReplyTTL != time.Minute {
		t.Errorf("reply = %d within %s", p.ReplyMax, p.ReplyTTL)
	}
	for _, subj := range append(p.Publish, p.Subscribe...) {
		if !server.IsValidSubject(subj) {
			t.Errorf("%q is not a valid subject", subj)
		}
	}
}

func FuzzValidSubjectToken(f *testing.F) {
	for _, s := range []string{"prod/n1", "a.b", "", "*", "ü", "a b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if ValidSubjectToken(s) != nil {
			return
		}
		// Anything accepted builds subjects the NATS server takes as literal
		// and that resolve back to the same Runner ID.
		cmd, err := Command(s)
		if err != nil || !server.IsValidLiteralSubject(cmd) {
			t.Fatalf("accepted token makes an invalid subject")
		}
		if got, ok := RunnerIDFromSubject(cmd); !ok || got != s {
			t.Fatalf("round trip failed")
		}
	})
}
