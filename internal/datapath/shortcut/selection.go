package shortcut

import (
	"fmt"
	"net/netip"
	"slices"
)

// Selection narrows which connections may be accelerated. The zero value
// selects every connection. Rules apply to new connections: a restart with
// other rules leaves established ones on the path they took.
type Selection struct {
	IncludePorts []uint16 // if set, only these server ports
	ExcludePorts []uint16
	IncludeCIDRs []netip.Prefix // if set, both addresses must be inside one
	ExcludeCIDRs []netip.Prefix // neither address may be inside one
	NoIPv6       bool           // only IPv4 (and v4-mapped) connections
}

// Validate rejects contradictory or malformed rules.
func (s Selection) Validate() error {
	for _, p := range append(slices.Clone(s.IncludePorts), s.ExcludePorts...) {
		if p == 0 {
			return fmt.Errorf("port 0 is not a valid selection port")
		}
	}
	for _, p := range s.IncludePorts {
		if slices.Contains(s.ExcludePorts, p) {
			return fmt.Errorf("port %d is both included and excluded", p)
		}
	}
	for _, c := range append(slices.Clone(s.IncludeCIDRs), s.ExcludeCIDRs...) {
		if !c.IsValid() {
			return fmt.Errorf("invalid CIDR %v", c)
		}
		if c != c.Masked() {
			return fmt.Errorf("CIDR %v has host bits set (did you mean %v?)", c, c.Masked())
		}
	}
	for _, c := range s.IncludeCIDRs {
		if slices.Contains(s.ExcludeCIDRs, c) {
			return fmt.Errorf("CIDR %v is both included and excluded", c)
		}
	}
	if s.NoIPv6 {
		for _, c := range s.IncludeCIDRs {
			if c.Addr().Is6() && !c.Addr().Is4In6() {
				return fmt.Errorf("CIDR %v is IPv6 but IPv6 is disabled", c)
			}
		}
	}
	if len(s.IncludePorts)+len(s.ExcludePorts) > 1024 || len(s.IncludeCIDRs)+len(s.ExcludeCIDRs) > 1024 {
		return fmt.Errorf("at most 1024 port rules and 1024 CIDR rules")
	}
	return nil
}

func (s Selection) flags() uint32 {
	var f shortcutEzCfgFlag
	if s.NoIPv6 {
		f |= shortcutEzCfgFlagEZ_CFG_NO_IPV6
	}
	if len(s.IncludePorts) > 0 {
		f |= shortcutEzCfgFlagEZ_CFG_PORT_ALLOWLIST
	}
	if len(s.IncludeCIDRs) > 0 {
		f |= shortcutEzCfgFlagEZ_CFG_CIDR_ALLOWLIST
	}
	return uint32(f)
}

// cidrKey is the LPM key of a prefix; IPv4 is stored v4-mapped.
func cidrKey(p netip.Prefix) shortcutEzCidrKey {
	a := p.Addr()
	bits := p.Bits()
	if a.Is4() {
		bits += 96
	}
	return shortcutEzCidrKey{Prefixlen: uint32(bits), Ip: a.As16()}
}

// writeSelection fills the rule maps of a freshly loaded datapath.
func (d *Shortcut) writeSelection(s Selection) error {
	put := func(rule shortcutEzRule, ports []uint16, cidrs []netip.Prefix) error {
		for _, p := range ports {
			if err := d.objs.EzScPortRules.Put(uint32(p), uint32(rule)); err != nil {
				return fmt.Errorf("port rule %d: %w", p, err)
			}
		}
		for _, c := range cidrs {
			k := cidrKey(c)
			if err := d.objs.EzScCidrRules.Put(&k, uint32(rule)); err != nil {
				return fmt.Errorf("CIDR rule %v: %w", c, err)
			}
		}
		return nil
	}
	if err := put(shortcutEzRuleEZ_RULE_INCLUDE, s.IncludePorts, s.IncludeCIDRs); err != nil {
		return err
	}
	return put(shortcutEzRuleEZ_RULE_EXCLUDE, s.ExcludePorts, s.ExcludeCIDRs)
}
