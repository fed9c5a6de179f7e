package cli

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode"
)

// A refused flag value is reported by one rule, for every flag of every
// command, whichever source it came from:
//
//	--heartbeat 5: want a duration such as 30s
//	COMPASS_HEARTBEAT=5: want a duration such as 30s
//
// the source as the user wrote it (the flag, or the environment variable
// that set it), the value as given, and what the flag accepts. The flag
// package's own "invalid value ... parse error" never reaches the user: the
// toolkit wraps every flag's Value (sourced) and keeps the first refusal.

// maxShownValue bounds a refused value shown in an error. Every typed
// flag's valid values (durations, numbers, booleans, enum words) are far
// shorter; a longer one is most likely something pasted into the wrong
// variable, possibly a token, and error lines end up in logs shipped off the
// node, so it is described by its length only.
const maxShownValue = 32

// ValueError is a flag value refused: by its type when parsed, or by the
// command (Invocation.BadValue). It is a usage error.
type ValueError struct {
	Source string // "--heartbeat", or the environment variable: "COMPASS_HEARTBEAT"
	Value  string // as given
	Reason string // what was wrong, what is accepted: "want a duration such as 30s"
	Whole  bool   // show Value whatever its length (the command's own refusal of a value it knows holds no secret)
	Err    error  // the cause, if any, for errors.Is
}

func (e *ValueError) Error() string {
	if strings.HasPrefix(e.Source, "--") {
		return fmt.Sprintf("%s %s: %s", e.Source, showValue(e.Value, e.Whole), e.Reason)
	}
	return fmt.Sprintf("%s=%s: %s", e.Source, showValue(e.Value, e.Whole), e.Reason)
}

func (e *ValueError) Unwrap() error { return e.Err }

// showValue is a value as an error shows it: bare when it is one plain word,
// quoted when it is empty or has spaces or unprintable characters, and,
// unless whole, by its length only past maxShownValue bytes.
func showValue(v string, whole bool) string {
	if len(v) > maxShownValue && !whole {
		return fmt.Sprintf("<%d bytes, not shown>", len(v))
	}
	if v == "" || strings.ContainsFunc(v, func(r rune) bool { return unicode.IsSpace(r) || !unicode.IsPrint(r) || r == '"' }) {
		return fmt.Sprintf("%q", v)
	}
	return v
}

// sourced wraps a flag's Value: it records what was given and from where,
// and turns a refusal into a ValueError.
type sourced struct {
	flag.Value
	name   string
	want   func(v string, err error) string // what the flag accepts, given the value and the Value's refusal
	source string                           // where the value being set comes from; "--name" unless the environment's
	given  string                           // the last value set, as given
	from   string                           // the source of the last value set; "" while the default holds
	first  *error                           // the flag set's first refusal
}

// IsBoolFlag keeps "--allow-plaintext-nats" (no value) working for a
// wrapped boolean.
func (s *sourced) IsBoolFlag() bool {
	b, ok := s.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// Get returns the wrapped Value's value, when it has one.
func (s *sourced) Get() any {
	if g, ok := s.Value.(flag.Getter); ok {
		return g.Get()
	}
	return s.Value.String()
}

func (s *sourced) Set(v string) error {
	src := s.source
	if src == "" {
		src = "--" + s.name
	}
	if err := s.Value.Set(v); err != nil {
		ve := &ValueError{Source: src, Value: v, Reason: s.want(v, err)}
		if *s.first == nil {
			*s.first = ve
		}
		return ve
	}
	s.given, s.from = v, src
	return nil
}

// wrapValues wraps every flag of fs (sourced) and returns them by name, with
// the slot the first refusal is kept in.
func wrapValues(fs *flag.FlagSet) (map[string]*sourced, *error) {
	first := new(error)
	values := map[string]*sourced{}
	fs.VisitAll(func(f *flag.Flag) {
		s := &sourced{Value: f.Value, name: f.Name, want: wants(f.Value), first: first}
		f.Value = s
		values[f.Name] = s
	})
	return values, first
}

// unwrap is f with its own Value, for flag.UnquoteUsage's type names.
func unwrap(f *flag.Flag) *flag.Flag {
	if s, ok := f.Value.(*sourced); ok {
		g := *f
		g.Value = s.Value
		return &g
	}
	return f
}

// errRange is the flag package's refusal of a number too large for its type.
const errRange = "value out of range"

// wants says what a flag of v's type accepts. The flag package's own types
// refuse with a bare "parse error" or "value out of range", so their answer
// comes from the type; any other Value (an enum such as --mode) says in its
// own error what it accepts.
func wants(v flag.Value) func(string, error) string {
	own := func(_ string, err error) string { return err.Error() }
	g, ok := v.(flag.Getter)
	if !ok {
		return own
	}
	whole := func(lo, hi string) func(string, error) string {
		return func(_ string, err error) string {
			if err.Error() == errRange {
				return fmt.Sprintf("want a whole number from %s to %s", lo, hi)
			}
			return "want a whole number such as 4"
		}
	}
	switch g.Get().(type) {
	case time.Duration:
		return wantDuration
	case bool:
		return func(string, error) string { return "want true or false" }
	case int:
		return whole(fmt.Sprint(math.MinInt), fmt.Sprint(math.MaxInt))
	case int64:
		return whole(fmt.Sprint(int64(math.MinInt64)), fmt.Sprint(int64(math.MaxInt64)))
	case uint:
		return whole("0", fmt.Sprint(uint(math.MaxUint)))
	case uint64:
		return whole("0", fmt.Sprint(uint64(math.MaxUint64)))
	case float64:
		return func(string, error) string { return "want a number such as 1.5" }
	}
	return own
}

// wantDuration says what a duration flag accepts. Days are the one unit
// people reach for that Go's durations lack (7d for a week), so that
// mistake is answered with the hours it means.
func wantDuration(v string, _ error) string {
	if days, ok := strings.CutSuffix(v, "d"); ok {
		if n, err := strconv.ParseFloat(days, 64); err == nil && n > 0 && n <= 1e6 {
			return fmt.Sprintf("want a duration such as 30s; the largest unit is h (%sd is %sh)", days, strconv.FormatFloat(n*24, 'f', -1, 64))
		}
	}
	return "want a duration such as 30s"
}

// Enum is a flag whose value is one of a fixed list of words (--log-format
// json|text, --output table|json); anything else is refused when it is set,
// from the command line or the environment alike.
type Enum struct {
	value   *string
	choices []string
}

// EnumVar defines an Enum flag on fs: p holds the word, value is the default.
func EnumVar(fs *flag.FlagSet, p *string, name, value, usage string, choices ...string) {
	*p = value
	fs.Var(&Enum{value: p, choices: choices}, name, usage)
}

func (e *Enum) String() string {
	if e == nil || e.value == nil {
		return ""
	}
	return *e.value
}

// Set accepts one of the choices.
func (e *Enum) Set(v string) error {
	for _, c := range e.choices {
		if v == c {
			*e.value = v
			return nil
		}
	}
	return errors.New("want " + orList(e.choices))
}

// Get returns the word.
func (e *Enum) Get() any { return *e.value }

// Choices lists the accepted words, for help.
func (e *Enum) Choices() []string { return e.choices }

// orList is "a", "a or b", "a, b or c".
func orList(words []string) string {
	switch len(words) {
	case 0:
		return "nothing"
	case 1:
		return words[0]
	}
	return strings.Join(words[:len(words)-1], ", ") + " or " + words[len(words)-1]
}
