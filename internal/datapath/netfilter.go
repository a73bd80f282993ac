package datapath

import (
	"errors"
	"fmt"
	"path/filepath"

	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// natPriority places ez_nat after every NAT of POST_ROUTING
// (NF_IP_PRI_NAT_SRC is 100), so conntrack holds the final translation.
// Quirk: the kernel refuses (EBUSY) two BPF programs at one hook and
// priority, so another datapath in this namespace takes the next one free.
const (
	natPriority     = 101
	natPriorityLast = 131
)

var natFamilies = []struct {
	name   string
	family link.NetfilterProtocolFamily
}{{"ipv4", link.NetfilterProtoIPv4}, {"ipv6", link.NetfilterProtoIPv6}}

// attachNAT attaches ez_nat to POST_ROUTING for IPv4 and IPv6 in the calling
// process's network namespace (the node's, for the agent). It learns NAT
// that this namespace applies to traffic between pods (kube-proxy DNAT).
// Netfilter links cannot be updated in place: a pinned link of an earlier
// agent is detached first, so handshakes NAT-ed in that instant are not
// learnt and stay on the kernel path. On error, Install's cleanup removes the
// pins; links not pinned yet are closed with the Datapath.
func (d *Datapath) attachNAT() error {
	for _, f := range natFamilies {
		pin := filepath.Join(d.cfg.Dir(), "link_nat_"+f.name)
		if old, err := link.LoadPinnedLink(pin, nil); err == nil {
			old.Unpin()
			old.Close()
		}
		var l link.Link
		var err error
		for prio := int32(natPriority); prio <= natPriorityLast; prio++ {
			l, err = link.AttachNetfilter(link.NetfilterOptions{
				Program:        d.objs.EzNat,
				ProtocolFamily: f.family,
				Hook:           link.NetfilterInetPostRouting,
				Priority:       prio,
			})
			if !errors.Is(err, unix.EBUSY) {
				break
			}
		}
		if err != nil {
			return fmt.Errorf("attach netfilter %s POST_ROUTING: %w", f.name, err)
		}
		d.links = append(d.links, l)
		if err := l.Pin(pin); err != nil {
			return fmt.Errorf("pin %s: %w", pin, err)
		}
	}
	return nil
}
