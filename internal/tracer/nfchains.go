package tracer

import (
	"fmt"
	"sort"

	"github.com/cilium/ebpf/link"
	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Table is a netfilter table class (enum ez_trc_table in bpf/tracer/tracer.h).
type Table uint8

const (
	TableRaw       = Table(tracerEzTrcTableEZ_TRC_T_RAW)
	TableConntrack = Table(tracerEzTrcTableEZ_TRC_T_CONNTRACK)
	TableMangle    = Table(tracerEzTrcTableEZ_TRC_T_MANGLE)
	TableDNAT      = Table(tracerEzTrcTableEZ_TRC_T_DNAT)
	TableFilter    = Table(tracerEzTrcTableEZ_TRC_T_FILTER)
	TableSNAT      = Table(tracerEzTrcTableEZ_TRC_T_SNAT)
	tableCount     = int(tracerEzTrcTableEZ_TRC_TABLES)
)

// tables names each class and gives its priority (enum ez_trc_prio);
// TestEnumNames checks that every class of the C enum is here.
var tables = [tableCount]struct {
	name string
	prio int32
}{
	TableRaw:       {"raw", int32(tracerEzTrcPrioEZ_TRC_PRIO_RAW)},
	TableConntrack: {"conntrack", int32(tracerEzTrcPrioEZ_TRC_PRIO_CONNTRACK)},
	TableMangle:    {"mangle", int32(tracerEzTrcPrioEZ_TRC_PRIO_MANGLE)},
	TableDNAT:      {"dnat", int32(tracerEzTrcPrioEZ_TRC_PRIO_DNAT)},
	TableFilter:    {"filter", int32(tracerEzTrcPrioEZ_TRC_PRIO_FILTER)},
	TableSNAT:      {"snat", int32(tracerEzTrcPrioEZ_TRC_PRIO_SNAT)},
}

// hookNames is indexed by NF_INET_* hook, EZ_TRC_HOOKS of them.
var hookNames = [tracerEzTrcNfEZ_TRC_HOOKS]string{
	unix.NF_INET_PRE_ROUTING: "pre", unix.NF_INET_LOCAL_IN: "in", unix.NF_INET_FORWARD: "fwd",
	unix.NF_INET_LOCAL_OUT: "out", unix.NF_INET_POST_ROUTING: "post",
}

func (t Table) String() string { return tables[t].name }

// tableOf names the table class nearest to a priority.
func tableOf(prio int32) Table {
	best, bestD := TableFilter, int64(1<<62)
	for i, t := range tables {
		d := int64(prio) - int64(t.prio)
		if d < 0 {
			d = -d
		}
		if d < bestD {
			best, bestD = Table(i), d
		}
	}
	return best
}

// Chain is one base chain (or the conntrack hook it implies) to time.
type Chain struct {
	Family   link.NetfilterProtocolFamily
	Hook     link.NetfilterInetHook
	Priority int32
	Table    Table
}

func (c Chain) String() string {
	fam := "ipv4"
	if c.Family == link.NetfilterProtoIPv6 {
		fam = "ipv6"
	}
	return fmt.Sprintf("%s %s %s", fam, hookNames[c.Hook], c.Table)
}

// BaseChains lists the base chains of the namespace's nftables ruleset
// ("" is the tracer's own), read over netlink (iptables-nft rules are
// nftables chains). The kernel here lacks nfnetlink_hook, so hooks
// registered without a chain are not listed; conntrack is inferred from nat
// chains and conntrack expressions or matches. Hooks of the legacy iptables
// backend are not seen.
func BaseChains(ns string) ([]Chain, error) {
	var opts []nftables.ConnOption
	if ns != "" {
		h, err := netns.GetFromName(ns)
		if err != nil {
			return nil, fmt.Errorf("netns %s: %w", ns, err)
		}
		defer h.Close()
		opts = append(opts, nftables.WithNetNSFd(int(h)))
	}
	conn, err := nftables.New(opts...)
	if err != nil {
		return nil, fmt.Errorf("nftables in %s: %w", nsLabel(ns), err)
	}
	chains, err := conn.ListChains()
	if err != nil {
		return nil, fmt.Errorf("nftables chains in %s: %w", nsLabel(ns), err)
	}
	ct := map[nftables.TableFamily]bool{}
	for _, c := range chains {
		if ct[c.Table.Family] {
			continue
		}
		rules, err := conn.GetRules(c.Table, c)
		if err != nil {
			return nil, fmt.Errorf("nftables rules of %s %s in %s: %w", c.Table.Name, c.Name, nsLabel(ns), err)
		}
		for _, r := range rules {
			if usesConntrack(r.Exprs) {
				ct[c.Table.Family] = true
				break
			}
		}
	}
	return chainsOf(chains, ct), nil
}

// usesConntrack reports whether a rule needs connection tracking: an nft ct
// expression, or an iptables-nft conntrack/state match.
func usesConntrack(es []expr.Any) bool {
	for _, e := range es {
		switch e := e.(type) {
		case *expr.Ct:
			return true
		case *expr.Match:
			if e.Name == "conntrack" || e.Name == "state" {
				return true
			}
		}
	}
	return false
}

// chainsOf turns nftables base chains into the chains to time, adding the
// conntrack hooks (PRE_ROUTING, LOCAL_OUT at -200) of every family with a nat
// chain or one in ct.
func chainsOf(chains []*nftables.Chain, ct map[nftables.TableFamily]bool) []Chain {
	seen := map[Chain]bool{}
	ctFam := map[link.NetfilterProtocolFamily]bool{}
	for fam, on := range ct {
		for _, f := range families(fam) {
			ctFam[f] = ctFam[f] || on
		}
	}
	for _, c := range chains {
		if c.Hooknum == nil || c.Priority == nil || c.Table == nil || *c.Hooknum > unix.NF_INET_POST_ROUTING {
			continue // not a base chain, or not an inet hook
		}
		for _, f := range families(c.Table.Family) {
			prio := int32(*c.Priority)
			seen[Chain{Family: f, Hook: link.NetfilterInetHook(*c.Hooknum), Priority: prio, Table: tableOf(prio)}] = true
			if c.Type == nftables.ChainTypeNAT {
				ctFam[f] = true
			}
		}
	}
	for f, on := range ctFam {
		if !on {
			continue
		}
		for _, h := range []link.NetfilterInetHook{link.NetfilterInetPreRouting, link.NetfilterInetLocalOut} {
			seen[Chain{Family: f, Hook: h, Priority: tables[TableConntrack].prio, Table: TableConntrack}] = true
		}
	}
	var out []Chain
	for c := range seen {
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Family != b.Family {
			return a.Family < b.Family
		}
		if a.Hook != b.Hook {
			return a.Hook < b.Hook
		}
		return a.Priority < b.Priority
	})
	return out
}

func families(f nftables.TableFamily) []link.NetfilterProtocolFamily {
	switch f {
	case nftables.TableFamilyIPv4:
		return []link.NetfilterProtocolFamily{link.NetfilterProtoIPv4}
	case nftables.TableFamilyIPv6:
		return []link.NetfilterProtocolFamily{link.NetfilterProtoIPv6}
	case nftables.TableFamilyINet:
		return []link.NetfilterProtocolFamily{link.NetfilterProtoIPv4, link.NetfilterProtoIPv6}
	}
	return nil
}
