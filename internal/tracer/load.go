package tracer

import (
	"fmt"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
	"github.com/eztunnel/eztunnel/internal/parts"
)

// load edits the generated spec (filters, sizes) and loads it.
func load(cfg Config) (*tracerObjects, error) {
	spec, err := loadTracer()
	if err != nil {
		return nil, fmt.Errorf("tracer spec: %w", err)
	}
	var specs tracerSpecs
	if err := spec.Assign(&specs); err != nil {
		return nil, err
	}
	specs.TrcPkts.MaxEntries = cfg.TableSize
	specs.TrcEvents.MaxEntries = cfg.RingSize
	if err := setFilter(&specs.tracerVariableSpecs, cfg); err != nil {
		return nil, err
	}
	var objs tracerObjects
	if err := spec.LoadAndAssign(&objs, nil); err != nil {
		// cilium/ebpf names the program; the verifier's last lines follow.
		return nil, fmt.Errorf("load tracer: %w", err)
	}
	return &objs, nil
}

// setFilter writes the configuration (struct ez_trc_config) on the spec.
func setFilter(v *tracerVariableSpecs, cfg Config) error {
	f := cfg.Filter
	host, err := bpfsys.NetNSCookie("")
	if err != nil {
		return err
	}
	proto, err := f.proto()
	if err != nil {
		return err
	}
	var netnsFilter uint64
	if f.NetNS != "" {
		if netnsFilter, err = bpfsys.NetNSCookie(f.NetNS); err != nil {
			return err
		}
	}
	var hosts [MaxHostNetNS]uint64
	for i, ns := range cfg.HostNetNS {
		if hosts[i], err = bpfsys.NetNSCookie(ns); err != nil {
			return fmt.Errorf("host netns %q: %w", ns, err)
		}
	}
	var wires [MaxWireNetNS]uint64
	for i, ns := range cfg.WireNetNS {
		if wires[i], err = bpfsys.NetNSCookie(ns); err != nil {
			return fmt.Errorf("wire netns %q: %w", ns, err)
		}
	}
	var addr [4]uint32
	if f.Host.IsValid() {
		b := f.Host.Unmap().AsSlice()
		for i := 0; i < len(b)/4; i++ {
			// Network byte order, as the kernel's saddr words are read.
			addr[i] = uint32(b[4*i]) | uint32(b[4*i+1])<<8 | uint32(b[4*i+2])<<16 | uint32(b[4*i+3])<<24
		}
	}
	c := tracerEzTrcConfig{
		HostNetns: host,
		MaxAgeNs:  uint64(cfg.MaxAge.Nanoseconds()),
		Netns:     netnsFilter,
		Hosts:     hosts,
		Wires:     wires,
		Host:      addr,
		Ifindex:   f.Ifindex,
		Port:      f.Port,
		Sport:     f.SrcPort,
		Dport:     f.DstPort,
		Family:    uint8(f.Family),
		Proto:     proto,
		HostSet:   boolU8(f.Host.IsValid()),
	}
	if err := v.EzTrcCfg.Set(c); err != nil {
		return fmt.Errorf("set %s: %w", v.EzTrcCfg.Name, err)
	}
	return nil
}

func boolU8(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}

// Probe reports whether the tracer's programs load here (nothing attached).
// Its stages attach where the kernel has them: see docs/kernels.md.
func Probe() parts.Status {
	objs, err := load(DefaultConfig())
	if err != nil {
		return parts.Status{Part: parts.Tracer, Code: parts.CodeOf(err), Reason: err.Error()}
	}
	objs.Close()
	return parts.Status{Part: parts.Tracer, Runs: true, Via: "tp_btf, raw_tp, tcx observers, netfilter links"}
}
