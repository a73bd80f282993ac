package netlab

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
	"github.com/eztunnel/eztunnel/internal/nodelayout"
)

// Kinds of resource a lab's owner record can hold besides the lab's own
// namespaces, links and cgroups (which its name finds). Each is undone by
// Undo, idempotently, when the lab closes or its owner died.
const (
	// RecPin: a bpffs path (pins of a datapath); removed recursively.
	RecPin = "pin"
	// RecNFChain family table chain: a chain in the host netns; every rule
	// of the table that jumps to it is deleted, then the chain.
	RecNFChain = "nft-chain"
	// RecNFTable family table: a host table the lab caused to exist (e.g.
	// iptables-nft's nat table); deleted if no chain of it holds a rule.
	RecNFTable = "nft-table"
	// RecSysctl path old: a host sysctl; old is written back.
	RecSysctl = "sysctl"
	// RecMount path: a mount on a directory under the temp dir; unmounted.
	RecMount = "mount"
	// RecConntrack prefix: the host netns's conntrack entries whose
	// original source or destination is in prefix (a lab's own subnet,
	// inside 10.77.0.0/16 or fd77::/16) are deleted. Bridged and routed
	// pod traffic leaves entries there (br_netfilter, the host's NAT), and
	// a connection whose FIN died with its veth stays ESTABLISHED for
	// nf_conntrack_tcp_timeout_established (5 days): a million of them
	// fill the table and the host drops every new flow.
	RecConntrack = "conntrack"
)

// labRanges hold every subnet a lab may record for RecConntrack.
var labRanges = []netip.Prefix{netip.MustParsePrefix("10.77.0.0/16"), netip.MustParsePrefix("fd77::/16")}

// Record notes a resource the lab created outside its namespaces, in the
// owner record, before the caller creates it: if the process dies, Sweep
// (or the next claim of the name) undoes it. The returned func undoes it
// now and forgets it.
func (l *Lab) Record(kind string, args ...string) (undo func() error, err error) {
	line := strings.Join(append([]string{kind}, args...), "\t")
	if _, err := parseRecord(line); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(ownerDir, l.Name), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return nil, fmt.Errorf("netlab: record %s: %w", line, err)
	}
	defer f.Close()
	if _, err := f.WriteString(line + "\n"); err != nil {
		return nil, fmt.Errorf("netlab: record %s: %w", line, err)
	}
	return func() error {
		err := undoRecord(line)
		if err == nil {
			l.forget(line)
		}
		return err
	}, nil
}

func (l *Lab) forget(line string) {
	path := filepath.Join(ownerDir, l.Name)
	b, err := os.ReadFile(path)
	if err != nil {
		return
	}
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	for i := len(lines) - 1; i > 0; i-- {
		if lines[i] == line {
			lines = append(lines[:i], lines[i+1:]...)
			break
		}
	}
	os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600)
}

// readRecords returns the owner pid line's value and the resource lines.
func readRecords(name string) (pid string, recs []string) {
	f, err := os.Open(filepath.Join(ownerDir, name))
	if err != nil {
		return "", nil
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for first := true; sc.Scan(); first = false {
		if first {
			pid = strings.TrimSpace(sc.Text())
			continue
		}
		if sc.Text() != "" {
			recs = append(recs, sc.Text())
		}
	}
	return pid, recs
}

// undoConntrack deletes the conntrack entries of a lab's RecConntrack
// records: again once its namespaces are gone, since traffic may have
// refreshed or created entries until then.
func undoConntrack(name string) error {
	_, recs := readRecords(name)
	var errs []error
	for _, line := range recs {
		if strings.HasPrefix(line, RecConntrack+"\t") {
			if err := undoRecord(line); err != nil {
				errs = append(errs, fmt.Errorf("lab %s: undo %q: %w", name, line, err))
			}
		}
	}
	return errors.Join(errs...)
}

// undoRecords undoes a lab's recorded resources, newest first.
func undoRecords(name string) error {
	_, recs := readRecords(name)
	var errs []error
	for i := len(recs) - 1; i >= 0; i-- {
		if err := undoRecord(recs[i]); err != nil {
			errs = append(errs, fmt.Errorf("lab %s: undo %q: %w", name, recs[i], err))
		}
	}
	return errors.Join(errs...)
}

func parseRecord(line string) ([]string, error) {
	f := strings.Split(line, "\t")
	want := map[string]int{RecPin: 2, RecNFChain: 4, RecNFTable: 3, RecSysctl: 3, RecMount: 2, RecConntrack: 2}[f[0]]
	if want == 0 || len(f) != want {
		return nil, fmt.Errorf("netlab: bad resource record %q", line)
	}
	if f[0] == RecPin && !strings.HasPrefix(filepath.Clean(f[1]), "/sys/fs/bpf/") {
		return nil, fmt.Errorf("netlab: pin record %q outside /sys/fs/bpf", f[1])
	}
	if f[0] == RecMount && !strings.HasPrefix(filepath.Clean(f[1]), filepath.Clean(os.TempDir())+"/") {
		return nil, fmt.Errorf("netlab: mount record %q outside %s", f[1], os.TempDir())
	}
	if f[0] == RecSysctl && !strings.HasPrefix(filepath.Clean(f[1]), "/proc/sys/") {
		return nil, fmt.Errorf("netlab: sysctl record %q outside /proc/sys", f[1])
	}
	if f[0] == RecConntrack {
		if _, err := labPrefix(f[1]); err != nil {
			return nil, err
		}
	}
	return f, nil
}

// labPrefix parses a RecConntrack prefix, which must lie inside labRanges.
func labPrefix(s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return p, fmt.Errorf("netlab: conntrack record %q: %w", s, err)
	}
	for _, r := range labRanges {
		if r.Bits() <= p.Bits() && r.Contains(p.Addr()) {
			return p.Masked(), nil
		}
	}
	return p, fmt.Errorf("netlab: conntrack record %q outside the labs' ranges %v", s, labRanges)
}

// FlushConntrack deletes the host netns's conntrack entries whose original
// source or destination lies in prefix (RecConntrack), and returns how many.
func FlushConntrack(prefix netip.Prefix) (uint, error) {
	if _, err := os.Stat("/proc/sys/net/netfilter/nf_conntrack_count"); errors.Is(err, os.ErrNotExist) {
		return 0, nil // nf_conntrack is not loaded: no entry (and no module loaded by asking)
	}
	fam := netlink.InetFamily(unix.AF_INET)
	if prefix.Addr().Is6() {
		fam = unix.AF_INET6
	}
	ipNet := &net.IPNet{IP: prefix.Addr().AsSlice(), Mask: net.CIDRMask(prefix.Bits(), prefix.Addr().BitLen())}
	var filters []netlink.CustomConntrackFilter
	for _, tp := range []netlink.ConntrackFilterType{netlink.ConntrackOrigSrcIP, netlink.ConntrackOrigDstIP} {
		f := &netlink.ConntrackFilter{}
		if err := f.AddIPNet(tp, ipNet); err != nil {
			return 0, err
		}
		filters = append(filters, f)
	}
	n, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, fam, filters...)
	if err != nil {
		return n, fmt.Errorf("netlab: delete conntrack entries of %s: %w", prefix, err)
	}
	return n, nil
}

func undoRecord(line string) error {
	f, err := parseRecord(line)
	if err != nil {
		return err
	}
	switch f[0] {
	case RecPin:
		// The files of that datapath's agents (the lab runs them in the
		// default run directory).
		l := nodelayout.Layout{PinRoot: f[1]}
		os.Remove(l.Lock())
		os.Remove(l.Report())
		os.Remove(l.Log())
		os.Remove(l.LogLevel())
		os.Remove(l.Socket())
		// Legacy tc filters live on their devices, not in their records.
		err := bpfsys.DetachTCFiltersUnder(f[1])
		return errors.Join(err, os.RemoveAll(f[1]))
	case RecSysctl:
		return os.WriteFile(f[1], []byte(f[2]+"\n"), 0o644)
	case RecNFChain:
		return deleteNFChain(f[1], f[2], f[3])
	case RecNFTable:
		return deleteEmptyNFTable(f[1], f[2])
	case RecConntrack:
		p, err := labPrefix(f[1])
		if err == nil {
			_, err = FlushConntrack(p)
		}
		return err
	case RecMount:
		err := unix.Unmount(f[1], unix.MNT_DETACH)
		if err == unix.EINVAL || err == unix.ENOENT { // not mounted (any more)
			err = nil
		}
		return err
	}
	return nil
}

// NFFamily maps "ip", "ip6", "inet" to the nftables family.
func NFFamily(name string) (nftables.TableFamily, error) {
	switch name {
	case "ip":
		return nftables.TableFamilyIPv4, nil
	case "ip6":
		return nftables.TableFamilyIPv6, nil
	case "inet":
		return nftables.TableFamilyINet, nil
	}
	return 0, fmt.Errorf("netlab: nftables family %q", name)
}

// NFTableExists reports whether the host netns has table family/name.
func NFTableExists(family, name string) (bool, error) {
	t, _, err := findNFTable(family, name)
	return t != nil, err
}

func findNFTable(family, name string) (*nftables.Table, *nftables.Conn, error) {
	fam, err := NFFamily(family)
	if err != nil {
		return nil, nil, err
	}
	c, err := nftables.New()
	if err != nil {
		return nil, nil, fmt.Errorf("netlab: nftables: %w", err)
	}
	tables, err := c.ListTablesOfFamily(fam)
	if err != nil {
		return nil, nil, fmt.Errorf("netlab: list nftables tables: %w", err)
	}
	for _, t := range tables {
		if t.Name == name {
			return t, c, nil
		}
	}
	return nil, c, nil
}

func chainsOf(c *nftables.Conn, t *nftables.Table) ([]*nftables.Chain, error) {
	all, err := c.ListChainsOfTableFamily(t.Family)
	if err != nil {
		return nil, fmt.Errorf("netlab: list nftables chains: %w", err)
	}
	var out []*nftables.Chain
	for _, ch := range all {
		if ch.Table.Name == t.Name {
			out = append(out, ch)
		}
	}
	return out, nil
}

func deleteNFChain(family, table, chain string) error {
	t, c, err := findNFTable(family, table)
	if err != nil || t == nil {
		return err
	}
	chains, err := chainsOf(c, t)
	if err != nil {
		return err
	}
	var target *nftables.Chain
	for _, ch := range chains {
		if ch.Name == chain {
			target = ch
		}
		rules, err := c.GetRules(t, ch)
		if err != nil {
			return fmt.Errorf("netlab: rules of %s %s %s: %w", family, table, ch.Name, err)
		}
		for _, r := range rules {
			for _, e := range r.Exprs {
				if v, ok := e.(*expr.Verdict); ok && v.Chain == chain {
					if err := c.DelRule(r); err != nil {
						return err
					}
					break
				}
			}
		}
	}
	if target != nil {
		c.FlushChain(target)
		c.DelChain(target)
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("netlab: delete chain %s %s %s: %w", family, table, chain, err)
	}
	return nil
}

// DeleteEmptyNFTable deletes family/table if no chain of it holds a rule:
// what iptables-nft left after its user removed every rule and chain.
func DeleteEmptyNFTable(family, table string) error { return deleteEmptyNFTable(family, table) }

func deleteEmptyNFTable(family, table string) error {
	t, c, err := findNFTable(family, table)
	if err != nil || t == nil {
		return err
	}
	chains, err := chainsOf(c, t)
	if err != nil {
		return err
	}
	for _, ch := range chains {
		rules, err := c.GetRules(t, ch)
		if err != nil {
			return err
		}
		if len(rules) > 0 {
			return nil // someone else's rules now live in it: keep it
		}
	}
	c.DelTable(t)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("netlab: delete table %s %s: %w", family, table, err)
	}
	return nil
}
