package main

import (
	"fmt"
	"net/netip"

	"github.com/spf13/pflag"

	"github.com/eztunnel/eztunnel/internal/datapath"
)

// selectionFlags are the raw selection flags; parse turns them into a
// datapath.Selection, naming the flag of any malformed value.
type selectionFlags struct {
	includePorts, excludePorts []uint
	includeCIDRs, excludeCIDRs []string
	ipv6                       bool
}

func (s *selectionFlags) register(f *pflag.FlagSet) {
	f.UintSliceVar(&s.includePorts, "include-ports", nil, "accelerate only connections to these server ports")
	f.UintSliceVar(&s.excludePorts, "exclude-ports", nil, "never accelerate connections to these server ports")
	f.StringSliceVar(&s.includeCIDRs, "include-cidrs", nil, "accelerate only connections whose both addresses are inside these prefixes")
	f.StringSliceVar(&s.excludeCIDRs, "exclude-cidrs", nil, "never accelerate connections with an address inside these prefixes")
	f.BoolVar(&s.ipv6, "ipv6", true, "accelerate IPv6 connections too")
}

func (s *selectionFlags) parse() (datapath.Selection, error) {
	sel := datapath.Selection{NoIPv6: !s.ipv6}
	var err error
	if sel.IncludePorts, err = ports("--include-ports", s.includePorts); err != nil {
		return sel, err
	}
	if sel.ExcludePorts, err = ports("--exclude-ports", s.excludePorts); err != nil {
		return sel, err
	}
	if sel.IncludeCIDRs, err = prefixes("--include-cidrs", s.includeCIDRs); err != nil {
		return sel, err
	}
	if sel.ExcludeCIDRs, err = prefixes("--exclude-cidrs", s.excludeCIDRs); err != nil {
		return sel, err
	}
	return sel, sel.Validate()
}

func ports(flag string, in []uint) ([]uint16, error) {
	out := make([]uint16, 0, len(in))
	for _, p := range in {
		if p < 1 || p > 65535 {
			return nil, fmt.Errorf("%s: port %d out of range 1..65535", flag, p)
		}
		out = append(out, uint16(p))
	}
	return out, nil
}

func prefixes(flag string, in []string) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(in))
	for _, s := range in {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", flag, err)
		}
		out = append(out, p)
	}
	return out, nil
}
