package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"time"
)

// logFlags are --log-level and --log-format.
type logFlags struct {
	level  string
	format string
}

// register adds both as Enums, so a bad value is refused when it is set, in
// the toolkit's one form naming its source (COMPASS_LOG_FORMAT=xml: want
// json or text), not later in terms of the flag the operator never typed.
func (l *logFlags) register(fs *flag.FlagSet) {
	l.level = "info"
	fs.Var((*levelValue)(&l.level), "log-level", "debug, info, warn or error")
	EnumVar(fs, &l.format, "log-format", "json", "json (one object per line) or text (logfmt)", "json", "text")
}

// levelValue is --log-level: what slog.Level reads (debug, info, warn,
// error, in any case, with an offset such as info+2), checked when it is set.
type levelValue string

func (v *levelValue) String() string { return string(*v) }

func (v *levelValue) Set(s string) error {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(s)); err != nil {
		return errors.New("want debug, info, warn or error")
	}
	*v = levelValue(s)
	return nil
}

func (l *logFlags) logger(w io.Writer) (*slog.Logger, error) {
	return NewLogger(w, l.format, l.level)
}

// NewLogger returns the project's logger on w: format is "json" or "text",
// level "debug", "info", "warn" or "error". Durations are written in seconds
// (a float), not Go's nanoseconds.
func NewLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, UsageError(fmt.Errorf("--log-level %q: want debug, info, warn or error", level))
	}
	opts := &slog.HandlerOptions{Level: lv, ReplaceAttr: seconds}
	switch format {
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	}
	return nil, UsageError(fmt.Errorf("--log-format %q: want json or text", format))
}

// seconds writes a duration as seconds: "retry_in":0.146, not 146000000.
func seconds(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		return slog.Float64(a.Key, a.Value.Duration().Seconds())
	}
	if a.Value.Kind() == slog.KindAny {
		if d, ok := a.Value.Any().(time.Duration); ok {
			return slog.Float64(a.Key, d.Seconds())
		}
	}
	return a
}
