package cli

import (
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/spf13/pflag"
)

// logFlags are the global --log-format and --log-level flags.
type logFlags struct {
	format, level string
}

func (l *logFlags) register(f *pflag.FlagSet) {
	f.StringVar(&l.format, "log-format", "text", "log format: text or json")
	f.StringVar(&l.level, "log-level", "info", "log level: debug, info, warn or error")
}

// level is the log level of the handlers the flags build: --log-level,
// changed at run time by SetLogLevel.
var level slog.LevelVar

// SetLogLevel changes the log level of the default logger while it runs.
func SetLogLevel(l slog.Level) { level.Set(l) }

// ParseLogLevel is a level's name as --log-level takes it.
func ParseLogLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return l, fmt.Errorf("log level %q: want debug, info, warn or error", s)
	}
	return l, nil
}

// handler builds the slog handler the flags ask for, writing to w.
func (l *logFlags) handler(w io.Writer) (slog.Handler, error) {
	lv, err := ParseLogLevel(l.level)
	if err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", l.level)
	}
	level.Set(lv)
	opts := &slog.HandlerOptions{Level: &level}
	switch strings.ToLower(l.format) {
	case "text":
		return slog.NewTextHandler(w, opts), nil
	case "json":
		return slog.NewJSONHandler(w, opts), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", l.format)
}
