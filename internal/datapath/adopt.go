package datapath

import (
	"github.com/eztunnel/eztunnel/internal/cgroupv2"
	"github.com/eztunnel/eztunnel/internal/datapath/shortcut"
	"github.com/eztunnel/eztunnel/internal/podnet"
)

// AdoptReport is what one adoption round did.
type AdoptReport = shortcut.AdoptReport

// AdoptCounterNames lists the adoption counters in enum order.
func AdoptCounterNames() []string { return shortcut.AdoptCounterNames() }

// Adopt runs one adoption round for the sockets below the attached cgroups:
// it visits the network namespace of every process in them.
func (d *Datapath) Adopt(cgroups []string) (AdoptReport, error) {
	var ids []uint64
	for _, cg := range cgroups {
		id, err := cgroupv2.ID(cg)
		if err != nil {
			return AdoptReport{}, err
		}
		ids = append(ids, id)
	}
	if err := d.sc.SetAdoptHooks(ids); err != nil {
		return AdoptReport{}, err
	}
	nss, denied, err := podnet.NetNamespaces(cgroups)
	if err != nil {
		return AdoptReport{}, err
	}
	rep, err := d.sc.Adopt(nss)
	rep.Denied = denied
	return rep, err
}
