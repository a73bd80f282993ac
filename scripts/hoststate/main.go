// Command hoststate prints what tests and the lab can leave on a host, one
// sorted line per item, for scripts/crash-test.sh to compare: named network
// namespaces, links of the host netns, nftables tables/chains/rule counts
// of the host netns (iptables-nft rules included), the bpffs tree, cgroups
// named like a lab's, lab owner records, and the temporary directory's
// entries a Go test run makes (t.TempDir's Test*, the go command's
// go-build*, the e2e run directory eztunnel-e2e-*, the lab's ez*), and the
// root directory's entries.
package main

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"

	"github.com/eztunnel/eztunnel/internal/cgroupv2"
	"github.com/eztunnel/eztunnel/lab/netlab"
)

func main() {
	var lines []string
	add := func(format string, args ...any) { lines = append(lines, fmt.Sprintf(format, args...)) }
	fail := func(what string, err error) {
		fmt.Fprintf(os.Stderr, "hoststate: %s: %v\n", what, err)
		os.Exit(1)
	}

	ns, err := os.ReadDir("/run/netns")
	if err != nil && !os.IsNotExist(err) {
		fail("netns", err)
	}
	for _, e := range ns {
		add("netns %s", e.Name())
	}
	links, err := netlink.LinkList()
	if err != nil {
		fail("links", err)
	}
	for _, l := range links {
		add("link %s %s", l.Attrs().Name, l.Type())
	}

	c, err := nftables.New()
	if err != nil {
		fail("nftables", err)
	}
	tables, err := c.ListTables()
	if err != nil {
		fail("nftables tables", err)
	}
	chains, err := c.ListChains()
	if err != nil {
		fail("nftables chains", err)
	}
	fam := map[nftables.TableFamily]string{nftables.TableFamilyIPv4: "ip", nftables.TableFamilyIPv6: "ip6",
		nftables.TableFamilyINet: "inet", nftables.TableFamilyARP: "arp", nftables.TableFamilyBridge: "bridge", nftables.TableFamilyNetdev: "netdev"}
	for _, t := range tables {
		add("nft table %s %s", fam[t.Family], t.Name)
	}
	for _, ch := range chains {
		rules, err := c.GetRules(ch.Table, ch)
		if err != nil {
			fail("nftables rules", err)
		}
		add("nft chain %s %s %s rules=%d", fam[ch.Table.Family], ch.Table.Name, ch.Name, len(rules))
	}

	filepath.WalkDir("/sys/fs/bpf", func(path string, d fs.DirEntry, err error) error {
		if err == nil && path != "/sys/fs/bpf" {
			add("bpffs %s", path)
		}
		return nil
	})

	if root, err := cgroupv2.Root(); err == nil {
		filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil || !d.IsDir() || path == root {
				return nil
			}
			rel, _ := filepath.Rel(root, path)
			if strings.HasPrefix(filepath.Base(path), netlab.Prefix) || strings.HasPrefix(rel, netlab.Prefix) {
				add("cgroup %s", rel)
			}
			return nil
		})
	}
	recs, _ := os.ReadDir("/run/eztunnel-labs")
	for _, e := range recs {
		add("lab-record %s", e.Name())
	}
	// The root directory: a build or test that writes "$(OUTPUT)/x" with an
	// empty OUTPUT leaves /x (the BPF selftests under a sub-make did).
	root, err := os.ReadDir("/")
	if err != nil {
		fail("root directory", err)
	}
	for _, e := range root {
		add("rootdir %s", e.Name())
	}
	tmp, _ := os.ReadDir(os.TempDir())
	for _, e := range tmp {
		for _, p := range []string{"Test", "go-build", "ez"} {
			if strings.HasPrefix(e.Name(), p) {
				add("tmp %s", e.Name())
				break
			}
		}
	}
	for _, f := range []string{"/proc/sys/net/ipv4/ip_forward"} {
		b, _ := os.ReadFile(f)
		add("sysctl %s %s", f, strings.TrimSpace(string(b)))
	}
	sort.Strings(lines)
	fmt.Println(strings.Join(lines, "\n"))
}
