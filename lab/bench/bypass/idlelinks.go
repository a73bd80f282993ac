package bypass

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
	"github.com/eztunnel/eztunnel/internal/cgroupv2"
	"github.com/eztunnel/eztunnel/internal/datapath"
	"github.com/eztunnel/eztunnel/lab/multinode"
)

// The links of a stopped agent, held by the bench so that it can detach
// them and attach them again in place (bench bypass --pairs N --pair idle).
// A link is detached only when its last holder lets go: the agent holds
// its links while it runs, so the bench takes them over from an agent that
// installed its datapath and stopped (stopping leaves the datapath pinned
// and working, as across an upgrade); its pins are then their only other
// holders. Detaching a link unpins and closes it; attaching it again makes
// a new link of the same program on the same target, in the node's
// namespace, and pins it where the old one was. A link cannot be attached
// again once detached, so the link IDs change; what the agent left (every
// pin with its program, type and target, and the order of the programs on
// each tcx hook) is the same at the end, which restore checks.

// heldLink is one pinned link of an agent.
type heldLink struct {
	pin    string
	name   string  // with --switch-links: the pin with a tcx link's namespace and device named (linkName)
	id     link.ID // the agent's (the order it attached its links in)
	cur    link.ID // the link attached now (the agent's, or the bench's last)
	prog   *ebpf.Program
	attach func(*ebpf.Program) (link.Link, error)
	l      link.Link // nil while detached
}

// nodeLinks are the links of one node's agent.
type nodeLinks struct {
	node  *multinode.Node
	root  string // the agent's --pin-path
	dir   string // the datapath's pins (datapath.Config.Dir)
	links []*heldLink
	// kept: the programs of the links not held (--switch-links), attached
	// on both sides.
	kept []ebpf.ProgramID
	// before: the links as the agent left them (linkState).
	before map[string]string
	// nsByCookie: the lab's network namespaces by cookie (a tcx link's
	// pin names the namespace of its device by cookie).
	nsByCookie map[uint64]string
}

// takeOver holds the links pinned under the stopped agent's pin root on
// node n; namespaces are the lab's network namespaces, where its tcx links
// may be (a pod's loopback has one too). With only set, it holds only the
// links whose name (linkName) only matches: the others stay attached by
// their pins throughout.
func takeOver(n *multinode.Node, pinRoot string, namespaces []string, only *regexp.Regexp) (nl *nodeLinks, err error) {
	nl = &nodeLinks{node: n, root: pinRoot, dir: datapath.Config{PinRoot: pinRoot}.Dir(), nsByCookie: map[uint64]string{}}
	defer func() {
		if err != nil {
			nl.release()
		}
	}()
	for _, ns := range namespaces {
		c, err := bpfsys.NetNSCookie(ns)
		if err != nil {
			return nil, err
		}
		nl.nsByCookie[c] = ns
	}
	pinned, err := datapath.Links(datapath.Config{PinRoot: pinRoot})
	if err != nil {
		return nil, err
	}
	for _, p := range pinned {
		if p.ID == 0 {
			return nil, fmt.Errorf("%s: a legacy tc filter (no tcx on this kernel): --pair idle detaches links only", p.Pin)
		}
		ns, err := nl.netnsOf(p.Pin)
		if err != nil {
			return nil, err
		}
		h := &heldLink{pin: filepath.Join(nl.dir, p.Pin)}
		if only != nil {
			if h.name, err = linkName(p.Pin, ns); err != nil {
				return nil, err
			}
		}
		if only != nil && !only.MatchString(h.name) {
			// Not held, but its program is timed too (it runs in A and B).
			info, err := pinnedLinkInfo(h.pin)
			if err != nil {
				return nil, err
			}
			nl.kept = append(nl.kept, info.Program)
			continue
		}
		nl.links = append(nl.links, h)
		if h.l, err = link.LoadPinnedLink(h.pin, nil); err != nil {
			return nil, fmt.Errorf("open pinned link %s: %w", h.pin, err)
		}
		info, err := h.l.Info()
		if err != nil {
			return nil, fmt.Errorf("link info of %s: %w", h.pin, err)
		}
		h.id, h.cur = info.ID, info.ID
		if h.prog, err = ebpf.NewProgramFromID(info.Program); err != nil {
			return nil, fmt.Errorf("program %d of %s: %w", info.Program, h.pin, err)
		}
		if h.attach, err = reattacher(info, h.prog.Type(), n.Managed, ns); err != nil {
			return nil, fmt.Errorf("%s: %w", h.pin, err)
		}
	}
	if only != nil && len(nl.links) == 0 {
		return nil, fmt.Errorf("--switch-links %s: none of the %d links of the agent on %s matches", only, len(pinned), n.Name)
	}
	// The agent's attach order: detach in reverse (the shortcut's egress
	// program last), attach again in it (the tcx hooks' order kept).
	slices.SortFunc(nl.links, func(a, b *heldLink) int { return int(a.id) - int(b.id) })
	if nl.before, err = nl.state(); err != nil {
		return nil, err
	}
	return nl, nil
}

// netnsOf is the namespace of the device of the tcx link pinned at rel
// (relative to the datapath's pins), "" for other links.
func (nl *nodeLinks) netnsOf(rel string) (string, error) {
	parts := strings.Split(filepath.ToSlash(rel), "/") // [<family>/]links/tcx/<cookie>/<ifindex>/<name>
	i := slices.Index(parts, bpfsys.LinksDir)
	if i < 0 || len(parts) < i+5 || parts[i+1] != bpfsys.KindTCX {
		return "", nil
	}
	c, err := strconv.ParseUint(parts[i+2], 10, 64)
	if err != nil {
		return "", fmt.Errorf("%s: no netns cookie: %w", rel, err)
	}
	ns, ok := nl.nsByCookie[c]
	if !ok {
		return "", fmt.Errorf("%s: netns cookie %d is none of the lab's namespaces", rel, c)
	}
	return ns, nil
}

// linkName is the pin rel (relative to the datapath's pins) of a link, with
// a tcx link's netns cookie and ifindex replaced by the namespace ns and
// the device's name: links/tcx/<netns>/<device>/<program>_<direction>.
func linkName(rel, ns string) (string, error) {
	parts := strings.Split(filepath.ToSlash(rel), "/")
	i := slices.Index(parts, bpfsys.LinksDir)
	if ns == "" || i < 0 || len(parts) < i+5 {
		return rel, nil
	}
	ifindex, err := strconv.Atoi(parts[i+3])
	if err != nil {
		return "", fmt.Errorf("%s: no ifindex: %w", rel, err)
	}
	var dev *net.Interface
	err = bpfsys.InNetNS(ns, func() (err error) {
		dev, err = net.InterfaceByIndex(ifindex)
		return err
	})
	if err != nil {
		return "", fmt.Errorf("%s: the device: %w", rel, err)
	}
	parts[i+2], parts[i+3] = ns, dev.Name
	return strings.Join(parts, "/"), nil
}

// reattacher is how a link like info's, of a program of type pt, is
// attached again. cgroups are looked up by ID below root; a tcx link's
// device is in the namespace ns.
func reattacher(info *link.Info, pt ebpf.ProgramType, root, ns string) (func(*ebpf.Program) (link.Link, error), error) {
	switch {
	case pt == ebpf.Tracing:
		// fentry, fexit, tp_btf (a raw tracepoint link, named by the
		// program's BTF target, not by a name).
		return func(p *ebpf.Program) (link.Link, error) { return link.AttachTracing(link.TracingOptions{Program: p}) }, nil
	case info.TCX() != nil:
		t := info.TCX()
		return func(p *ebpf.Program) (l link.Link, err error) {
			err = bpfsys.InNetNS(ns, func() error {
				l, err = link.AttachTCX(link.TCXOptions{Interface: int(t.Ifindex), Program: p, Attach: ebpf.AttachType(t.AttachType)})
				return err
			})
			return l, err
		}, nil
	case info.Cgroup() != nil:
		c := info.Cgroup()
		path, err := cgroupByID(root, c.CgroupId)
		if err != nil {
			return nil, err
		}
		return func(p *ebpf.Program) (link.Link, error) {
			return link.AttachCgroup(link.CgroupOptions{Path: path, Attach: ebpf.AttachType(c.AttachType), Program: p})
		}, nil
	case info.Netfilter() != nil:
		nf := info.Netfilter()
		return func(p *ebpf.Program) (link.Link, error) {
			return link.AttachNetfilter(link.NetfilterOptions{Program: p, ProtocolFamily: nf.ProtocolFamily, Hook: nf.Hook, Priority: nf.Priority, NetfilterFlags: link.NetfilterAttachFlags(nf.Flags)})
		}, nil
	case info.RawTracepoint() != nil:
		name := info.RawTracepoint().Name
		return func(p *ebpf.Program) (link.Link, error) {
			return link.AttachRawTracepoint(link.RawTracepointOptions{Name: name, Program: p})
		}, nil
	case info.PerfEvent() != nil && info.PerfEvent().Tracepoint() != nil:
		name := info.PerfEvent().Tracepoint().Tracepoint
		if !strings.HasPrefix(name, "sys_enter_") && !strings.HasPrefix(name, "sys_exit_") {
			return nil, fmt.Errorf("tracepoint %s: not a syscalls tracepoint", name)
		}
		// The event id through the host's tracefs or a private mount, as the
		// agent attached it (this host mounts no tracefs).
		return func(p *ebpf.Program) (link.Link, error) { return bpfsys.AttachTraceEvent("syscalls", name, p) }, nil
	}
	return nil, fmt.Errorf("link type %v: not one --pair idle can attach again", info.Type)
}

// cgroupByID is the cgroup below root (root included) whose ID is id.
func cgroupByID(root string, id uint64) (string, error) {
	found := ""
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() || found != "" {
			return err
		}
		if cid, err := cgroupv2.ID(path); err == nil && cid == id {
			found = path
			return fs.SkipAll
		}
		return nil
	})
	if err == nil && found == "" {
		err = fmt.Errorf("no cgroup with ID %d below %s", id, root)
	}
	return found, err
}

// setAttached detaches (false) or attaches again (true) every link of the
// node, in its namespace; links already so are left alone.
func (nl *nodeLinks) setAttached(on bool) error {
	return nl.node.Do(func() error {
		if !on {
			for _, h := range slices.Backward(nl.links) {
				if h.l == nil {
					continue
				}
				if err := h.l.Unpin(); err != nil {
					return fmt.Errorf("unpin %s: %w", h.pin, err)
				}
				err := h.l.Close()
				h.l = nil
				if err != nil {
					return fmt.Errorf("detach %s: %w", h.pin, err)
				}
				// Proof that the kernel let go of it (its programs
				// may not run on the path to show it): closing the
				// last fd frees the link and its ID at once.
				if err := gone(h.cur); err != nil {
					return fmt.Errorf("detach %s: %w", h.pin, err)
				}
			}
			return nil
		}
		for _, h := range nl.links {
			if h.l != nil {
				continue
			}
			l, err := h.attach(h.prog)
			if err != nil {
				return fmt.Errorf("attach %s again: %w", h.pin, err)
			}
			if err := l.Pin(h.pin); err != nil {
				l.Close()
				return fmt.Errorf("pin %s again: %w", h.pin, err)
			}
			info, err := l.Info()
			if err != nil {
				l.Close()
				return fmt.Errorf("link info of %s: %w", h.pin, err)
			}
			h.l, h.cur = l, info.ID
		}
		return nil
	})
}

// gone fails unless no link has id: another holder of a link the bench
// detached would keep it attached.
func gone(id link.ID) error {
	l, err := link.NewFromID(id)
	switch {
	case err == nil:
		l.Close()
		return fmt.Errorf("link %d is still there: something else holds it", id)
	case errors.Is(err, os.ErrNotExist):
		return nil
	}
	return fmt.Errorf("link %d: %w", id, err)
}

// switchedPrograms are the names of the programs of the links held
// (switched), and of those kept attached on both sides.
func (nl *nodeLinks) switchedPrograms() (switched, kept map[string]bool, err error) {
	switched, kept = map[string]bool{}, map[string]bool{}
	for _, h := range nl.links {
		info, err := h.prog.Info()
		if err != nil {
			return nil, nil, err
		}
		switched[info.Name] = true
	}
	for _, id := range nl.kept {
		p, err := ebpf.NewProgramFromID(id)
		if err != nil {
			return nil, nil, err
		}
		info, err := p.Info()
		p.Close()
		if err != nil {
			return nil, nil, err
		}
		kept[info.Name] = true
	}
	return switched, kept, nil
}

// restore attaches every link again and checks the pins are as the agent
// left them; it releases the bench's hold (the pins keep the links).
func (nl *nodeLinks) restore() error {
	err := nl.setAttached(true)
	if err == nil {
		var after map[string]string
		if after, err = nl.state(); err == nil {
			err = sameLinks(nl.before, after)
		}
	}
	nl.release()
	if err != nil {
		return fmt.Errorf("the agent's links on %s: %w", nl.node.Name, err)
	}
	return nil
}

// release closes what the bench holds (pinned links stay attached).
func (nl *nodeLinks) release() {
	for _, h := range nl.links {
		if h.l != nil {
			h.l.Close()
			h.l = nil
		}
		if h.prog != nil {
			h.prog.Close()
			h.prog = nil
		}
	}
}

// programs are the IDs of the links' programs (held or kept), each once.
func (nl *nodeLinks) programs() []ebpf.ProgramID {
	var ids []ebpf.ProgramID
	for _, id := range nl.kept {
		if !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	for _, h := range nl.links {
		info, err := h.prog.Info()
		if err != nil {
			continue
		}
		if id, ok := info.ID(); ok && !slices.Contains(ids, id) { // one program may have several links
			ids = append(ids, id)
		}
	}
	return ids
}

// state is linkState of the node's links, read in its namespace (tcx
// hooks are by ifindex).
func (nl *nodeLinks) state() (st map[string]string, err error) {
	err = nl.node.Do(func() error {
		st, err = linkState(nl.root, nl.netnsOf)
		return err
	})
	return st, err
}

// linkState describes every link of the datapath pinned at pinRoot by its pin: type,
// program and target (not the link's ID), and for a tcx link the programs
// on its hook in order.
func linkState(pinRoot string, netnsOf func(rel string) (string, error)) (map[string]string, error) {
	dir := datapath.Config{PinRoot: pinRoot}.Dir()
	pinned, err := datapath.Links(datapath.Config{PinRoot: pinRoot})
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, p := range pinned {
		info, err := pinnedLinkInfo(filepath.Join(dir, p.Pin))
		if err != nil {
			return nil, err
		}
		s := fmt.Sprintf("type %v, program %d", info.Type, info.Program)
		switch {
		case info.TCX() != nil:
			t := info.TCX()
			ns, err := netnsOf(p.Pin)
			if err != nil {
				return nil, err
			}
			var q *link.QueryResult
			err = bpfsys.InNetNS(ns, func() (err error) {
				q, err = link.QueryPrograms(link.QueryOptions{Target: int(t.Ifindex), Attach: ebpf.AttachType(t.AttachType)})
				return err
			})
			if err != nil {
				return nil, fmt.Errorf("programs on the hook of %s: %w", p.Pin, err)
			}
			var order []ebpf.ProgramID
			for _, ap := range q.Programs {
				order = append(order, ap.ID)
			}
			s += fmt.Sprintf(", netns %s ifindex %d %v, the hook's programs %v", ns, t.Ifindex, t.AttachType, order)
		case info.Cgroup() != nil:
			s += fmt.Sprintf(", cgroup %d %v", info.Cgroup().CgroupId, info.Cgroup().AttachType)
		case info.Netfilter() != nil:
			s += fmt.Sprintf(", netfilter %+v", *info.Netfilter())
		case info.RawTracepoint() != nil:
			s += ", raw tracepoint " + info.RawTracepoint().Name
		case info.Tracing() != nil:
			s += fmt.Sprintf(", tracing %+v", *info.Tracing())
		case info.PerfEvent() != nil && info.PerfEvent().Tracepoint() != nil:
			s += ", tracepoint " + info.PerfEvent().Tracepoint().Tracepoint
		}
		out[p.Pin] = s
	}
	return out, nil
}

// pinnedLinkInfo is the info of the link pinned at pin.
func pinnedLinkInfo(pin string) (*link.Info, error) {
	l, err := link.LoadPinnedLink(pin, nil)
	if err != nil {
		return nil, fmt.Errorf("open pinned link %s: %w", pin, err)
	}
	defer l.Close()
	info, err := l.Info()
	if err != nil {
		return nil, fmt.Errorf("link info of %s: %w", pin, err)
	}
	return info, nil
}

// sameLinks fails unless before and after describe the same links.
func sameLinks(before, after map[string]string) error {
	var errs []error
	for pin, b := range before {
		if a, ok := after[pin]; !ok {
			errs = append(errs, fmt.Errorf("%s: gone (was %s)", pin, b))
		} else if a != b {
			errs = append(errs, fmt.Errorf("%s: %s, was %s", pin, a, b))
		}
	}
	for pin, a := range after {
		if _, ok := before[pin]; !ok {
			errs = append(errs, fmt.Errorf("%s: new (%s)", pin, a))
		}
	}
	return errors.Join(errs...)
}
