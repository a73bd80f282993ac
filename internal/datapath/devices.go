package datapath

import (
	"fmt"
	"log/slog"
	"net"
	"slices"

	"github.com/vishvananda/netlink"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
	"github.com/eztunnel/eztunnel/internal/datapath/shortcut"
	"github.com/eztunnel/eztunnel/internal/podnet"
	"github.com/eztunnel/eztunnel/internal/rtnl"
)

// closeResetDevices lists the devices of this network namespace that FINs of
// accelerated connections cross, for the RST on close (shortcut.Device):
// the loopback device (egress: both ends are here), each pod's host-side
// veth from podnet (ingress: what the pod sends) and the bridges they are
// ports of (egress: what this namespace sends to a pod). A FIN that a
// process of this namespace sends to a pod leaves through the bridge
// device (__dev_queue_xmit runs the bridge's tcx egress before
// br_dev_xmit) and then its veth; one pod's FIN to another is forwarded
// from port to port (br_forward) and never passes the bridge device's
// egress, so pod-to-pod traffic meets the program once, at the sender's
// veth, instead of at both veths.
func closeResetDevices(st podnet.State) ([]shortcut.Device, error) {
	links, err := netlink.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	bridges := st.Bridges()
	var devs []shortcut.Device
	for _, l := range links {
		a := l.Attrs()
		if a.Flags&net.FlagLoopback != 0 || bridges[a.Index] {
			devs = append(devs, shortcut.Device{Ifindex: a.Index, Name: a.Name, Egress: true})
		}
	}
	for _, p := range st.Ports {
		devs = append(devs, shortcut.Device{Ifindex: p.Ifindex, Name: p.Name, Ingress: true})
	}
	slices.SortFunc(devs, func(a, b shortcut.Device) int { return a.Ifindex - b.Ifindex })
	return devs, nil
}

// scanDevices is closeResetDevices of a fresh podnet scan.
func scanDevices() ([]shortcut.Device, error) {
	h, err := rtnl.Route()
	if err != nil {
		return nil, fmt.Errorf("netlink: %w", err)
	}
	defer h.Close()
	st, err := podnet.Scan(h)
	if err != nil {
		return nil, err
	}
	return closeResetDevices(st)
}

// SyncDevices converges the RST-on-close device links to the loopback device,
// the pods' veths and their bridges of st (the agent's podnet watch), as one transaction.
func (d *Datapath) SyncDevices(st podnet.State) error {
	devs, err := closeResetDevices(st)
	if err != nil {
		return err
	}
	var attached, pruned, skipped []string
	if err := bpfsys.RunTx(func(tx *bpfsys.Tx) (err error) {
		attached, pruned, skipped, err = d.sc.SyncDevices(tx, devs)
		return err
	}); err != nil {
		return err
	}
	if err := d.sc.SyncCoverage(); err != nil {
		return err
	}
	if len(attached)+len(pruned)+len(skipped) > 0 {
		slog.Info("RST-on-close devices converged", "attached", len(attached), "detached", len(pruned), "gone", skipped, "devices", len(d.sc.Devices()))
	}
	return nil
}

// CoverageWanted are the network namespaces whose first handshakes found
// their loopback without the RST on close since the last call
// (shortcut.CoverageWanted): SyncLoopbacks covers them, if the managed
// cgroups' processes still live there.
func (d *Datapath) CoverageWanted() ([]uint64, error) { return d.sc.CoverageWanted() }

// SyncLoopbacks attaches the RST on close to the loopback device of every
// network namespace a process of the cgroups lives in (an application and
// its sidecar talk over it), and detaches it from namespaces that went away,
// as one transaction. denied counts processes whose namespace the agent may
// not open (Kubernetes without hostPID).
func (d *Datapath) SyncLoopbacks(cgroups []string) (denied int, err error) {
	nss, denied, err := podnet.NetNamespaces(cgroups)
	if err != nil {
		return denied, err
	}
	var attached, pruned []string
	err = bpfsys.RunTx(func(tx *bpfsys.Tx) (err error) {
		var n int
		attached, pruned, n, err = d.sc.SyncLoopbacks(tx, nss)
		denied += n
		return err
	})
	if err != nil {
		return denied, err
	}
	if err := d.sc.SyncCoverage(); err != nil {
		return denied, err
	}
	if len(attached)+len(pruned) > 0 {
		slog.Info("RST-on-close pod loopbacks converged", "attached", len(attached), "detached", len(pruned))
	}
	return denied, nil
}
