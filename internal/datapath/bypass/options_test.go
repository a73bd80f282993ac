package bypass

import (
	"testing"

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
