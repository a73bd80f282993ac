package bypass

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/spf13/pflag"

	"github.com/eztunnel/eztunnel/internal/parts"
)

// Options is how the bypass is asked for (`eztunnel run --bypass`, the
// chart's bypass values) and, when it does not run, why: the one place the
// agent, the datapath and the metrics read that reason from.
type Options struct {
	// On runs the bridge bypass (pod traffic of one node and between
	// nodes) on the bridges' veths and the uplinks of the agent's network
	// namespace, pinned with the datapath (a restart updates it in place).
	// Off: a bypass an earlier agent pinned is removed.
	On bool
	// Required (--bypass given explicitly): a node or kernel that cannot
	// run the bypass is an error; without it the agent runs without the
	// bypass and says why.
	Required bool
	// Off says why it does not run ("" while On); OffCode is its kind,
	// the metrics' reason.
	Off     string
	OffCode parts.Code
	// NoUDP leaves UDP on the kernel path (--bypass-udp=false): the
	// bypass takes established TCP only.
	NoUDP bool
	// NoIPv6 leaves IPv6 on the kernel path (--bypass-ipv6=false): the
	// bypass takes IPv4 only.
	NoIPv6 bool
	// Recheck is how long the full checks one packet of a flow direction
	// passed (the destination pod or the FIB route to another node, the
	// sender's address, the conntrack admission) stand for the direction's
	// next packets on that CPU (--bypass-recheck): a conntrack entry
	// deleted or changed holds for bypassed packets within it, an endpoint
	// change at once, a route, rule or neighbour change once the agent read
	// its rtnetlink notification. 0 checks every packet in full.
	Recheck time.Duration

	mode mode // --bypass
	udp  bool // --bypass-udp
	ipv6 bool // --bypass-ipv6
}

// DefaultRecheck is --bypass-recheck's default and MaxRecheck its bound.
const (
	DefaultRecheck = time.Millisecond
	MaxRecheck     = time.Second
)

// checkRecheck refuses a recheck time outside 0 to MaxRecheck, naming it.
func checkRecheck(d time.Duration) error {
	if d < 0 || d > MaxRecheck {
		return fmt.Errorf("%s: want 0 (every packet checked in full) to %s", d, MaxRecheck)
	}
	return nil
}

// mode is --bypass: auto (the default: on where the node allows it), on
// (required: a node or kernel that cannot run it is an error), off (not
// attached; a pinned one removed). true and false are on and off; the flag
// alone is on.
type mode string

const (
	modeAuto mode = "auto"
	modeOn   mode = "on"
	modeOff  mode = "off"
)

func (m *mode) String() string { return string(*m) }
func (m *mode) Type() string   { return "auto|on|off" }
func (m *mode) Set(v string) error {
	switch v {
	case "auto":
		*m = modeAuto
	case "on", "true":
		*m = modeOn
	case "off", "false":
		*m = modeOff
	default:
		return fmt.Errorf("%q: want auto, on or off", v)
	}
	return nil
}

// Register adds the bypass's flags to f.
func (o *Options) Register(f *pflag.FlagSet) {
	o.mode = modeAuto
	f.Var(&o.mode, "bypass", "bridge bypass: established pod-to-pod TCP/UDP skips the bridge and the node's stack, on one node and between nodes (tcx on the veth ports of the bridges and on the uplinks in the agent's network namespace; pinned with the datapath). It needs net.netfilter.nf_conntrack_tcp_be_liberal=1. auto: on where the node allows it, else off with the reason logged; on: a node or kernel that cannot run it is an error; off: not attached, a pinned one removed (true and false: on and off)")
	f.Lookup("bypass").NoOptDefVal = string(modeOn)
	f.BoolVar(&o.udp, "bypass-udp", true, "the bridge bypass takes established UDP flows too; false leaves every UDP packet on the node's stack (counted as fallback reason udp_off)")
	f.DurationVar(&o.Recheck, "bypass-recheck", DefaultRecheck, "how long the checks a packet of a flow passed (destination pod or route to another node, sender, conntrack admission) stand for the flow's next packets on that CPU: a conntrack entry deleted or changed (conntrack -D, a policy agent) holds for bypassed packets within this time, an endpoint change at once, a route or neighbour change once the agent read its notification; 0 checks every packet in full (at most 1s)")
	f.BoolVar(&o.ipv6, "bypass-ipv6", true, "the bridge bypass takes IPv6 flows too; false leaves every IPv6 packet on the node's stack (counted as fallback reason ipv6_off), for nodes whose IPv6 policy the operator wants the stack to apply to every packet")
}

// Parse completes o once f is parsed (f: the flags Register added to).
func (o *Options) Parse(*pflag.FlagSet) error {
	o.On, o.Required = o.mode != modeOff, o.mode == modeOn
	o.NoUDP, o.NoIPv6 = !o.udp, !o.ipv6
	if err := checkRecheck(o.Recheck); err != nil {
		return fmt.Errorf("--bypass-recheck=%w", err)
	}
	if !o.On {
		o.Off, o.OffCode = "off (--bypass=off)", parts.CodeDisabledByFlag
	}
	return nil
}

// CheckNode checks the node before anything changes (Check: the conntrack
// settings the bypass needs): a node that does not meet them turns the
// bypass off with the reason, logged, unless Required. Nothing is loaded.
func (o *Options) CheckNode() error {
	if !o.On {
		return nil
	}
	if err := Check(&Config{}); err != nil {
		var unmet *UnmetError
		if !errors.As(err, &unmet) || o.Required {
			return fmt.Errorf("--bypass: %w", err)
		}
		slog.Warn("running without the bridge bypass (--bypass=auto: on where the node allows it; --bypass=off silences this)", "reason", err.Error())
		o.On, o.Off, o.OffCode = false, err.Error(), parts.CodeOf(err)
	}
	return nil
}

// Refused records that the kernel refused the bypass's programs at install
// (why and its code: the datapath's reason); the rest of the datapath runs.
func (o *Options) Refused(code parts.Code, why string) {
	slog.Warn("running without the bridge bypass: this kernel refused it", "reason", why, "code", code)
	o.On, o.Off, o.OffCode = false, why, code
}
