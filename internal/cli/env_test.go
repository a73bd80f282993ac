package cli

import (
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

func TestEnvName(t *testing.T) {
	for flag, want := range map[string]string{
		"cgroup":       "EZTUNNEL_CGROUP",
		"max-sockets":  "EZTUNNEL_MAX_SOCKETS",
		"metrics-addr": "EZTUNNEL_METRICS_ADDR",
		"log-format":   "EZTUNNEL_LOG_FORMAT",
	} {
		if got := envName(flag); got != want {
			t.Errorf("envName(%q) = %q, want %q", flag, got, want)
		}
	}
}

type testFlags struct {
	fs      *pflag.FlagSet
	cgroups []string
	max     uint32
	addr    string
	age     time.Duration
	ipv6    bool
	pinPath string
}

func newTestFlags() *testFlags {
	f := &testFlags{fs: pflag.NewFlagSet("t", pflag.ContinueOnError)}
	f.fs.StringSliceVar(&f.cgroups, "cgroup", nil, "")
	f.fs.Uint32Var(&f.max, "max-sockets", 131072, "")
	f.fs.StringVar(&f.addr, "metrics-addr", "", "")
	f.fs.DurationVar(&f.age, "pair-max-age", time.Minute, "")
	f.fs.BoolVar(&f.ipv6, "ipv6", true, "")
	f.fs.StringVar(&f.pinPath, "pin-path", "/sys/fs/bpf/eztunnel", "")
	f.fs.Bool("help", false, "")
	return f
}

func env(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

// Every kind of flag is set from its variable; unset variables leave defaults.
func TestBindEnvSetsFlags(t *testing.T) {
	f := newTestFlags()
	if err := f.fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	err := bindEnv(f.fs, env(map[string]string{
		"EZTUNNEL_CGROUP":       "/a,/b",
		"EZTUNNEL_MAX_SOCKETS":  "64",
		"EZTUNNEL_METRICS_ADDR": ":9464",
		"EZTUNNEL_PAIR_MAX_AGE": "5s",
		"EZTUNNEL_IPV6":         "false",
		"EZTUNNEL_HELP":         "true",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(f.cgroups, " ") != "/a /b" || f.max != 64 || f.addr != ":9464" || f.age != 5*time.Second || f.ipv6 {
		t.Errorf("flags not set from env: %+v", f)
	}
	if f.pinPath != "/sys/fs/bpf/eztunnel" {
		t.Errorf("pin-path changed without its variable: %q", f.pinPath)
	}
	if h, _ := f.fs.GetBool("help"); h {
		t.Error("EZTUNNEL_HELP set --help")
	}
}

// A flag on the command line wins over its variable, even an invalid one.
func TestBindEnvExplicitFlagWins(t *testing.T) {
	f := newTestFlags()
	if err := f.fs.Parse([]string{"--max-sockets", "8", "--cgroup", "/x"}); err != nil {
		t.Fatal(err)
	}
	if err := bindEnv(f.fs, env(map[string]string{"EZTUNNEL_MAX_SOCKETS": "abc", "EZTUNNEL_CGROUP": "/y"})); err != nil {
		t.Fatal(err)
	}
	if f.max != 8 || strings.Join(f.cgroups, ",") != "/x" {
		t.Errorf("env overrode explicit flags: max %d cgroups %v", f.max, f.cgroups)
	}
}

func TestBindEnvInvalidNamesVariable(t *testing.T) {
	for name, val := range map[string]string{
		"EZTUNNEL_MAX_SOCKETS":  "abc",
		"EZTUNNEL_PAIR_MAX_AGE": "soon",
		"EZTUNNEL_IPV6":         "maybe",
	} {
		f := newTestFlags()
		f.fs.Parse(nil)
		err := bindEnv(f.fs, env(map[string]string{name: val}))
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s=%s: error %v does not name the variable", name, val, err)
		}
	}
}

func TestLogHandler(t *testing.T) {
	var b strings.Builder
	for _, ok := range []logFlags{{"text", "info"}, {"json", "debug"}, {"JSON", "warn"}, {"text", "error"}} {
		if _, err := ok.handler(&b); err != nil {
			t.Errorf("%+v: %v", ok, err)
		}
	}
	for _, bad := range []logFlags{{"xml", "info"}, {"text", "verbose"}} {
		if _, err := bad.handler(&b); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
	h, _ := (&logFlags{"json", "warn"}).handler(&b)
	if h.Enabled(t.Context(), -4) {
		t.Error("warn level enables debug")
	}
}
