package tracer

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
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
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return nil, fmt.Errorf("load tracer: %+v", ve)
		}
		return nil, fmt.Errorf("load tracer: %w", err)
	}
	return &objs, nil
}

// setFilter writes the read-only globals.
func setFilter(v *tracerVariableSpecs, cfg Config) error {
	f := cfg.Filter
	host, err := netnsCookie("")
	if err != nil {
		return err
	}
	proto, err := f.proto()
	if err != nil {
		return err
	}
	var netnsFilter uint64
	if f.NetNS != "" {
		if netnsFilter, err = netnsCookie(f.NetNS); err != nil {
			return err
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
	sets := []struct {
		v   *ebpf.VariableSpec
		val any
	}{
		{v.HostNetns, host},
		{v.MaxAgeNs, uint64(cfg.MaxAge.Nanoseconds())},
		{v.F_family, uint8(f.Family)},
		{v.F_proto, proto},
		{v.F_port, f.Port},
		{v.F_sport, f.SrcPort},
		{v.F_dport, f.DstPort},
		{v.F_hostSet, boolU8(f.Host.IsValid())},
		{v.F_host, addr},
		{v.F_ifindex, f.Ifindex},
		{v.F_netns, netnsFilter},
	}
	for _, s := range sets {
		if err := s.v.Set(s.val); err != nil {
			return fmt.Errorf("set %s: %w", s.v.Name, err)
		}
	}
	return nil
}

func boolU8(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}
