package bpfsys

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// AttachTCFilter attaches prog as f in the calling thread's netns (cookie:
// its cookie) within tx, recorded under dir (AttachTCFilter): a filter an
// earlier agent recorded there gets prog in place, and gets its own program
// back on rollback; a new one is detached on rollback.
func (tx *Tx) AttachTCFilter(dir string, cookie uint64, f TCFilter, prog *ebpf.Program) error {
	rec := TCRecord(dir, cookie, f)
	prev, _ := ebpf.LoadPinnedProgram(rec, nil)
	if err := AttachTCFilter(dir, cookie, f, prog); err != nil {
		if prev != nil {
			prev.Close()
		}
		return err
	}
	tx.OnRollback(func() error {
		if prev == nil {
			return DetachTCFilter(rec)
		}
		return InNetNSCookie(cookie, func() error { return AttachTCFilter(dir, cookie, f, prev) })
	})
	if prev != nil {
		tx.OnDone(prev.Close)
	}
	return tx.Changed("tc " + rec)
}

// UpgradePinned gives every link pinned under dir, and every legacy tc
// filter recorded there, that runs a program named as one of progs that
// program in place, within tx: rollback gives each its old program back.
// This is how a
// family's new build takes over what an earlier agent pinned before the
// family converges; links of other programs (other families') are left
// alone. It returns how many it upgraded.
func (tx *Tx) UpgradePinned(dir string, progs []*ebpf.Program) (int, error) {
	byName := map[string]*ebpf.Program{}
	for _, p := range progs {
		info, err := p.Info()
		if err != nil {
			return 0, fmt.Errorf("program info: %w", err)
		}
		// cilium/ebpf reads a name the kernel cut to 15 bytes back from
		// BTF; both are keys.
		byName[info.Name], byName[kernelName(info.Name)] = p, p
	}
	pins, err := PinnedLinks(dir)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, pin := range pins {
		name, err := pinnedLinkProgram(pin)
		if err != nil {
			return n, err
		}
		p := byName[name]
		if p == nil {
			continue
		}
		l, ok, err := tx.UpdatePinned(pin, p, nil)
		if err != nil {
			return n, err
		}
		if ok {
			tx.OnDone(l.Close)
			n++
		}
	}
	recs, err := TCRecords(dir)
	if err != nil {
		return n, err
	}
	for _, rec := range recs {
		cookie, f, err := ParseTCRecord(rec)
		if err != nil {
			continue
		}
		p := byName[f.Name]
		if p == nil {
			continue
		}
		err = InNetNSCookie(cookie, func() error { return tx.AttachTCFilter(dir, cookie, f, p) })
		if errors.Is(err, errNoSuchNetNS) || errors.Is(err, ErrDeviceGone) {
			continue // gone with its namespace or device: the family prunes the record
		}
		if err != nil {
			return n, fmt.Errorf("upgrade %s: %w", rec, err)
		}
		n++
	}
	return n, nil
}

// pinnedLinkProgram is the name of the program the link pinned at pin runs.
func pinnedLinkProgram(pin string) (string, error) {
	l, err := link.LoadPinnedLink(pin, nil)
	if err != nil {
		return "", fmt.Errorf("open pinned link %s: %w", pin, err)
	}
	defer l.Close()
	info, err := l.Info()
	if err != nil {
		return "", fmt.Errorf("link info of %s: %w", pin, err)
	}
	p, err := ebpf.NewProgramFromID(info.Program)
	if err != nil {
		return "", fmt.Errorf("program %d of pinned link %s: %w", info.Program, pin, err)
	}
	defer p.Close()
	pi, err := p.Info()
	if err != nil {
		return "", fmt.Errorf("program %d of pinned link %s: %w", info.Program, pin, err)
	}
	return pi.Name, nil
}

// kernelName is name as the kernel keeps it (BPF_OBJ_NAME_LEN with its NUL).
func kernelName(name string) string {
	if len(name) > 15 {
		return name[:15]
	}
	return name
}
