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

// handler builds the slog handler the flags ask for, writing to w.
func (l *logFlags) handler(w io.Writer) (slog.Handler, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(l.level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", l.level)
	}
	opts := &slog.HandlerOptions{Level: level}
	switch strings.ToLower(l.format) {
	case "text":
		return slog.NewTextHandler(w, opts), nil
	case "json":
		return slog.NewJSONHandler(w, opts), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", l.format)
}
