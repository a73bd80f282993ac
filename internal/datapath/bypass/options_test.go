package bypass

import (
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

// TestOptionsFlag: --bypass=auto|on|off as the chart's bypass value, true
// and false as on and off, the flag alone on; anything else refused.
func TestOptionsFlag(t *testing.T) {
	for _, c := range []struct {
		args         []string
		on, required bool
		off          string
	}{
		{nil, true, false, ""},
		{[]string{"--bypass=auto"}, true, false, ""},
		{[]string{"--bypass=on"}, true, true, ""},
		{[]string{"--bypass"}, true, true, ""},
		{[]string{"--bypass=true"}, true, true, ""},
		{[]string{"--bypass=off"}, false, false, "off (--bypass=off)"},
		{[]string{"--bypass=false"}, false, false, "off (--bypass=off)"},
	} {
		var o Options
		f := pflag.NewFlagSet("run", pflag.ContinueOnError)
		o.Register(f)
		if err := f.Parse(c.args); err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		o.Parse(f)
		if o.On != c.on || o.Required != c.required || o.Off != c.off {
			t.Errorf("%v: on %v required %v off %q, want %v %v %q", c.args, o.On, o.Required, o.Off, c.on, c.required, c.off)
		}
	}
	var o Options
	f := pflag.NewFlagSet("run", pflag.ContinueOnError)
	f.SetOutput(new(discard))
	o.Register(f)
	if err := f.Parse([]string{"--bypass=maybe"}); err == nil {
		t.Error("--bypass=maybe accepted")
	}
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// TestOptionsRecheck: --bypass-recheck defaults to DefaultRecheck, takes 0
// (every packet checked in full) up to MaxRecheck, and refuses the rest,
// naming the flag.
func TestOptionsRecheck(t *testing.T) {
	for _, c := range []struct {
		arg  string
		want time.Duration
		err  bool
	}{
		{"", DefaultRecheck, false},
		{"--bypass-recheck=0", 0, false},
		{"--bypass-recheck=250us", 250 * time.Microsecond, false},
		{"--bypass-recheck=1s", time.Second, false},
		{"--bypass-recheck=1001ms", 0, true},
		{"--bypass-recheck=-1ms", 0, true},
	} {
		var o Options
		f := pflag.NewFlagSet("run", pflag.ContinueOnError)
		o.Register(f)
		var args []string
		if c.arg != "" {
			args = []string{c.arg}
		}
		if err := f.Parse(args); err != nil {
			t.Fatalf("%s: %v", c.arg, err)
		}
		err := o.Parse(f)
		if c.err {
			if err == nil || !strings.Contains(err.Error(), "--bypass-recheck") {
				t.Errorf("%s: error %v, want one naming --bypass-recheck", c.arg, err)
			}
			continue
		}
		if err != nil || o.Recheck != c.want {
			t.Errorf("%s: recheck %s, error %v; want %s", c.arg, o.Recheck, err, c.want)
		}
	}
}
