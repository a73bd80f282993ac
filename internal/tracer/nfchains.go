package tracer

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"sort"
	"strings"
	"time"

	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

var errBusy = unix.EBUSY

// Table is a netfilter table class, by the iptables priority it sits at.
type Table uint8

const (
	TableRaw Table = iota
	TableConntrack
	TableMangle
	TableDNAT
	TableFilter
	TableSNAT
	tableCount
)

var tableNames = [...]string{"raw", "conntrack", "mangle", "dnat", "filter", "snat"}
var tablePrio = [...]int32{-300, -200, -150, -100, 0, 100}

func (t Table) String() string { return tableNames[t] }

// tableOf names the table class nearest to a priority.
func tableOf(prio int32) Table {
	best, bestD := TableFilter, int64(1<<62)
	for i, p := range tablePrio {
		d := int64(prio) - int64(p)
		if d < 0 {
			d = -d
		}
		if d < bestD {
			best, bestD = Table(i), d
		}
	}
	return best
}

var hookNames = [...]string{"pre", "in", "fwd", "out", "post"}
var nftHooks = map[string]link.NetfilterInetHook{
	"prerouting": link.NetfilterInetPreRouting, "input": link.NetfilterInetLocalIn,
	"forward": link.NetfilterInetForward, "output": link.NetfilterInetLocalOut,
	"postrouting": link.NetfilterInetPostRouting,
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

type nftRuleset struct {
	Nftables []map[string]json.RawMessage `json:"nftables"`
}

type nftChain struct {
	Family string `json:"family"`
	Type   string `json:"type"`
	Hook   string `json:"hook"`
	Prio   int32  `json:"prio"`
}

// baseChains lists the base chains of the namespace's ruleset, from `nft -j
// list ruleset` (iptables-nft rules are nftables chains). The kernel here
// lacks nfnetlink_hook, so hooks registered without a chain are not listed;
// conntrack is inferred from nat chains and ct expressions. Hooks of the
// legacy iptables backend are not seen.
func baseChains(ns string) ([]Chain, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	args := []string{"-j", "list", "ruleset"}
	cmd := exec.CommandContext(ctx, "nft", args...)
	if ns != "" {
		cmd = exec.CommandContext(ctx, "nsenter", append([]string{"--net=/run/netns/" + ns, "--", "nft"}, args...)...)
	}
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("nft list ruleset in %s: %w", nsLabel(ns), err)
	}
	return parseChains(out)
}

func parseChains(js []byte) ([]Chain, error) {
	var rs nftRuleset
	if err := json.Unmarshal(js, &rs); err != nil {
		return nil, fmt.Errorf("nft json: %w", err)
	}
	seen := map[Chain]bool{}
	ct := map[link.NetfilterProtocolFamily]bool{}
	add := func(c Chain) { seen[c] = true }
	for _, obj := range rs.Nftables {
		if _, ok := obj["rule"]; ok && strings.Contains(string(obj["rule"]), `"ct"`) {
			var r struct {
				Family string `json:"family"`
			}
			json.Unmarshal(obj["rule"], &r)
			for _, f := range families(r.Family) {
				ct[f] = true
			}
		}
		raw, ok := obj["chain"]
		if !ok {
			continue
		}
		var c nftChain
		if err := json.Unmarshal(raw, &c); err != nil {
			return nil, fmt.Errorf("nft chain: %w", err)
		}
		hook, ok := nftHooks[c.Hook]
		if !ok {
			continue // not a base chain, or not an inet hook
		}
		for _, f := range families(c.Family) {
			add(Chain{Family: f, Hook: hook, Priority: c.Prio, Table: tableOf(c.Prio)})
			if c.Type == "nat" {
				ct[f] = true
			}
		}
	}
	for f := range ct {
		for _, h := range []link.NetfilterInetHook{link.NetfilterInetPreRouting, link.NetfilterInetLocalOut} {
			add(Chain{Family: f, Hook: h, Priority: -200, Table: TableConntrack})
		}
	}
	var chains []Chain
	for c := range seen {
		chains = append(chains, c)
	}
	sort.Slice(chains, func(i, j int) bool {
		a, b := chains[i], chains[j]
		if a.Family != b.Family {
			return a.Family < b.Family
		}
		if a.Hook != b.Hook {
			return a.Hook < b.Hook
		}
		return a.Priority < b.Priority
	})
	return chains, nil
}

func families(f string) []link.NetfilterProtocolFamily {
	switch f {
	case "ip":
		return []link.NetfilterProtocolFamily{link.NetfilterProtoIPv4}
	case "ip6":
		return []link.NetfilterProtocolFamily{link.NetfilterProtoIPv6}
	case "inet":
		return []link.NetfilterProtocolFamily{link.NetfilterProtoIPv4, link.NetfilterProtoIPv6}
	}
	return nil
}
