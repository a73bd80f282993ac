package bypass

import (
	"fmt"

	"github.com/cilium/ebpf"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
	"github.com/eztunnel/eztunnel/internal/parts"
)

// Name names the family (datapath.Family).
func (b *Bypass) Name() string { return "bypass" }

// Install gives the links and legacy tc filters an earlier agent pinned
// under the pin directory, in every network namespace, this load's
// programs in place within tx (datapath.Family). The bypass attaches to no
// cgroup: its devices converge afterwards (Attach, AttachUplinks, Prune).
func (b *Bypass) Install(tx *bpfsys.Tx, _ []string) error {
	if b.pinDir == "" {
		return nil
	}
	if _, err := tx.UpgradePinned(b.pinDir, map[string]*ebpf.Program{bypassProgEzBypass: b.objs.EzBypass, bypassProgEzBypassIn: b.objs.EzBypassIn, bypassProgEzBypassAdmit: b.objs.EzBypassAdmit}); err != nil {
		return fmt.Errorf("bypass: %w", err)
	}
	return nil
}

// Parts reports the bypass as running (datapath.Family): it loads whole or
// not at all.
func (b *Bypass) Parts() parts.Report {
	var rep parts.Report
	rep.On(parts.Bypass, Via())
	return rep
}
