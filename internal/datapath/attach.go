package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/eztunnel/eztunnel/internal/cgroupv2"
)

// cgroupHook is one program attached to every managed cgroup.
type cgroupHook struct {
	name   string
	attach ebpf.AttachType
	prog   func(*Datapath) *ebpf.Program
}

// Order matters: the egress program must see a client's SYN before sockops
// can enrol it, so egress is attached first and detached last.
var cgroupHooks = []cgroupHook{
	{"egress", ebpf.AttachCGroupInetEgress, func(d *Datapath) *ebpf.Program { return d.objs.EzEgress }},
	{"sockops", ebpf.AttachCGroupSockOps, func(d *Datapath) *ebpf.Program { return d.objs.EzSockops }},
}

func (d *Datapath) linkPin(hook string, cgroupID uint64) string {
	return filepath.Join(d.cfg.Dir(), fmt.Sprintf("link_%s_%d", hook, cgroupID))
}

func (d *Datapath) progPin() string { return filepath.Join(d.cfg.Dir(), "prog_ez_msg") }

// Attach installs the datapath on a cgroup v2 subtree: sk_msg on the sockhash,
// then cgroup_skb egress, then sockops. Links already pinned for this cgroup
// are updated in place to the new programs (upgrade without a gap). On error
// everything this call created is removed again.
func (d *Datapath) Attach(cgroupPath string) (err error) {
	if err := cgroupv2.Validate(cgroupPath); err != nil {
		return err
	}
	cgID, err := cgroupv2.ID(cgroupPath)
	if err != nil {
		return err
	}
	var undo []func()
	defer func() {
		if err != nil {
			for i := len(undo) - 1; i >= 0; i-- {
				undo[i]()
			}
		}
	}()

	skmsg := link.RawAttachProgramOptions{Target: d.objs.EzSockets.FD(), Program: d.objs.EzMsg, Attach: ebpf.AttachSkMsgVerdict}
	hadProg := exists(d.progPin())
	if err := link.RawAttachProgram(skmsg); err != nil {
		return fmt.Errorf("attach sk_msg to sockhash: %w", err)
	}
	if !hadProg {
		undo = append(undo, func() {
			link.RawDetachProgram(link.RawDetachProgramOptions{Target: skmsg.Target, Program: skmsg.Program, Attach: skmsg.Attach})
		})
	}
	os.Remove(d.progPin())
	if err := d.objs.EzMsg.Pin(d.progPin()); err != nil {
		return fmt.Errorf("pin sk_msg program: %w", err)
	}
	if !hadProg {
		undo = append(undo, func() { os.Remove(d.progPin()) })
	}

	for _, h := range cgroupHooks {
		pin := d.linkPin(h.name, cgID)
		if l, lerr := link.LoadPinnedLink(pin, nil); lerr == nil {
			if err := l.Update(h.prog(d)); err != nil {
				l.Close()
				return fmt.Errorf("update pinned %s link %s: %w", h.name, pin, err)
			}
			d.links = append(d.links, l)
			continue
		} else if !errors.Is(lerr, os.ErrNotExist) {
			return fmt.Errorf("open pinned %s link %s: %w", h.name, pin, lerr)
		}
		l, err := link.AttachCgroup(link.CgroupOptions{Path: cgroupPath, Attach: h.attach, Program: h.prog(d)})
		if err != nil {
			return fmt.Errorf("attach %s to cgroup %s: %w", h.name, cgroupPath, err)
		}
		undo = append(undo, func() { l.Close() })
		if err := l.Pin(pin); err != nil {
			return fmt.Errorf("pin %s link: %w", h.name, err)
		}
		undo = append(undo, func() { l.Unpin() })
		d.links = append(d.links, l)
	}
	return nil
}
