// Package tracer follows packets through the kernel stack with tracepoints,
// tcx observers and BPF netfilter links (no kprobes, no fentry), and turns
// each packet lifetime into a Record: a timestamp per stage, the flow tuple,
// interfaces and CPUs. docs/tracing.md describes the identity model.
package tracer

import (
	"fmt"
	"net/netip"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Filter selects packets in the kernel before any event is produced. A zero
// field is "any". Host matches either address, Port either port.
type Filter struct {
	Host    netip.Addr
	Port    uint16
	SrcPort uint16
	DstPort uint16
	Proto   string // "", "tcp" or "udp"
	Family  int    // 0, 4 or 6
	Ifindex uint32 // device where the lifetime starts
	NetNS   string // netns name (/run/netns) where the lifetime starts
}

func (f Filter) proto() (uint8, error) {
	switch strings.ToLower(f.Proto) {
	case "":
		return 0, nil
	case "tcp":
		return unix.IPPROTO_TCP, nil
	case "udp":
		return unix.IPPROTO_UDP, nil
	}
	return 0, fmt.Errorf("protocol %q: want tcp or udp", f.Proto)
}

// Iface is an interface that gets tcx observers, in a named netns ("" is
// the tracer's own).
type Iface struct {
	NetNS string
	Name  string
}

// ParseIface reads "name" or "netns:name".
func ParseIface(s string) (Iface, error) {
	ns, name, ok := strings.Cut(s, ":")
	if !ok {
		name, ns = ns, ""
	}
	if name == "" {
		return Iface{}, fmt.Errorf("interface %q: want NAME or NETNS:NAME", s)
	}
	return Iface{NetNS: ns, Name: name}, nil
}

// Limits of Config.HostNetNS and Config.WireNetNS (struct ez_trc_config).
const (
	MaxHostNetNS = int(tracerEzTrcLimitsEZ_TRC_MAX_HOSTS)
	MaxWireNetNS = int(tracerEzTrcLimitsEZ_TRC_MAX_WIRES)
)

// Config of one trace.
type Config struct {
	Filter     Filter
	Interfaces []Iface       // tcx observers, first and last
	NetNS      []string      // namespaces whose netfilter chains are timed; "" is the tracer's own
	HostNetNS  []string      // more namespaces on the host side (nodes), besides the tracer's own; at most MaxHostNetNS
	WireNetNS  []string      // namespaces not traced (a lab's underlay switch: the wire between nodes); at most MaxWireNetNS
	TableSize  uint32        // live lifetimes at once
	RingSize   uint32        // ring buffer bytes, a power of two
	MaxAge     time.Duration // a lifetime idle this long is over
	RawTP      bool          // use raw_tp even where tp_btf attaches
}

// DefaultConfig is what `eztunnel trace` uses without flags.
func DefaultConfig() Config {
	return Config{TableSize: 65536, RingSize: 8 << 20, MaxAge: time.Second, NetNS: []string{""}}
}

// Validate rejects a configuration before anything is loaded.
func (c Config) Validate() error {
	if _, err := c.Filter.proto(); err != nil {
		return err
	}
	if c.Filter.Family != 0 && c.Filter.Family != 4 && c.Filter.Family != 6 {
		return fmt.Errorf("family %d: want 4 or 6", c.Filter.Family)
	}
	if c.TableSize < 16 || c.TableSize > 1<<22 {
		return fmt.Errorf("table size %d out of range [16, %d]", c.TableSize, 1<<22)
	}
	if c.RingSize < 1<<16 || c.RingSize&(c.RingSize-1) != 0 {
		return fmt.Errorf("ring buffer size %d must be a power of two of at least 64 KiB", c.RingSize)
	}
	if len(c.HostNetNS) > MaxHostNetNS || len(c.WireNetNS) > MaxWireNetNS {
		return fmt.Errorf("%d host and %d wire namespaces: at most %d and %d", len(c.HostNetNS), len(c.WireNetNS), MaxHostNetNS, MaxWireNetNS)
	}
	if c.MaxAge < time.Millisecond {
		return fmt.Errorf("max age %s must be at least 1ms", c.MaxAge)
	}
	return nil
}
