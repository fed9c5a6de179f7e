package flagenv

import (
	"flag"
	"io"
	"strings"
	"testing"
)

func TestApply(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	a := fs.String("a", "da", "")
	b := fs.String("b", "db", "")
	c := fs.String("c", "dc", "")
	n := fs.Int("n", 1, "")
	if err := fs.Parse([]string{"-a", "flag"}); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"COMPASS_A": "env-a", "COMPASS_B": "env-b", "COMPASS_N": "7"}
	envOf := map[string]string{"a": "COMPASS_A", "b": "COMPASS_B", "c": "COMPASS_C", "n": "COMPASS_N"}
	if err := Apply(fs, envOf, func(k string) string { return env[k] }); err != nil {
		t.Fatal(err)
	}
	if *a != "flag" || *b != "env-b" || *c != "dc" || *n != 7 {
		t.Fatalf("a=%q b=%q c=%q n=%d; want the flag, then the env, then the default", *a, *b, *c, *n)
	}
	// A bad value is refused with the variable's name.
	fs2 := flag.NewFlagSet("t", flag.ContinueOnError)
	fs2.Int("n", 1, "")
	err := Apply(fs2, map[string]string{"n": "COMPASS_N"}, func(string) string { return "seven" })
	if err == nil || !strings.HasPrefix(err.Error(), "COMPASS_N: ") {
		t.Fatalf("err = %v, want one naming COMPASS_N", err)
	}
}

func TestPrintFlags(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.String("nats-url", "nats://127.0.0.1:4222", "NATS `URL`s,\ncomma-separated")
	fs.Duration("wait", 0, "how long")
	fs.Bool("verbose", false, "more logs")
	var b strings.Builder
	PrintFlags(&b, fs, func(name string) string {
		if name == "verbose" {
			return ""
		}
		return "COMPASS_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
	})
	want := `  --nats-url URL  (env COMPASS_NATS_URL)
      NATS URLs,
      comma-separated (default "nats://127.0.0.1:4222")
  --verbose
      more logs
  --wait duration  (env COMPASS_WAIT)
      how long
`
	if b.String() != want {
		t.Fatalf("got:\n%s\nwant:\n%s", b.String(), want)
	}
}
