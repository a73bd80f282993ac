package bpfsys

import (
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/eztunnel/eztunnel/internal/parts"
)

// Legacy tc. A kernel without tcx links (before Linux 6.6) runs a sched_cls
// program as a cls_bpf filter in direct-action mode under the device's
// clsact qdisc. A tcx program's TCX_NEXT (-1) is TC_ACT_UNSPEC there: the
// next filter, then the stack, as with tcx. Such a filter is held by its
// device, not by a pin, so the program itself is pinned as the record of
// it, at <dir>/tc/<netns cookie>/<ifindex>/<program>_<direction>.
// Uninstall, pruning and the lab's sweep detach filters from these records
// (DetachTCFilters). A clsact qdisc eztunnel adds stays, empty, after its
// filters go: deleting one under traffic dropped packets here (6.18 with
// tcx beside it: TestBypassAgent's uninstall under traffic lost a UDP
// datagram in 1 run of 4 with the deletion, none in 6 without), and an
// empty clsact changes no packet's path.
const (
	TCDir       = "tc"
	clsactKind  = "clsact"
	tcTestEnv   = "EZTUNNEL_TEST_LEGACY_TC"
	legacyProto = unix.ETH_P_ALL
)

// TCFilter is one legacy tc attachment: a named program at a device's
// ingress or egress, at a priority (lower runs first).
type TCFilter struct {
	Ifindex int
	Ingress bool
	Name    string // the program's name: the filter's TCA_BPF_NAME and its handle
	Prio    uint16
}

func (f TCFilter) dir() string {
	if f.Ingress {
		return "ingress"
	}
	return "egress"
}

func (f TCFilter) parent() uint32 {
	if f.Ingress {
		return netlink.HANDLE_MIN_INGRESS
	}
	return netlink.HANDLE_MIN_EGRESS
}

// handle is the filter's handle at its priority: from the program's name,
// never 0 (0 asks the kernel to choose one).
func (f TCFilter) handle() uint32 {
	h := fnv.New32a()
	h.Write([]byte(f.Name))
	return h.Sum32() | 1
}

// TCRecord is the record pin of f under dir (a family's pin directory) for
// the netns with that cookie.
func TCRecord(dir string, cookie uint64, f TCFilter) string {
	return filepath.Join(dir, TCDir, strconv.FormatUint(cookie, 10), strconv.Itoa(f.Ifindex), f.Name+"_"+f.dir())
}

// ErrDeviceGone: the device of a tc attachment does not exist (any more).
var ErrDeviceGone = errors.New("device gone")

// UseTCX reports whether tc programs attach as tcx links (Linux 6.6), else
// as legacy cls_bpf filters. EZTUNNEL_TEST_LEGACY_TC=1 makes it report
// legacy, so tests prove that path on kernels with tcx (never set it in
// production).
func UseTCX() bool {
	if os.Getenv(tcTestEnv) == "1" {
		return false
	}
	return haveTCX() == nil
}

var haveTCX = sync.OnceValue(func() error {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:         ebpf.SchedCLS,
		License:      "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, -1), asm.Return()},
	})
	if err != nil {
		return err
	}
	defer prog.Close()
	return TCX(prog)
})

// TCAttachable checks prog can be attached to a device here: as a tcx link,
// or else as a legacy tc filter, tried on the loopback of a network
// namespace made for the trial.
//
// The trial's thread goes back to its network namespace and is unlocked, so
// it lives on. A locked thread that ends (the runtime discards it) sends
// SIGKILL to every child forked from it with Pdeathsig set (the parent-death
// signal follows the forking thread, not the process: golang/go#27505):
// that killed the lab's and the tests' servers, which on Linux 6.1, where
// this trial runs, looked like "connection refused" now and then.
func TCAttachable(prog *ebpf.Program) error {
	if UseTCX() {
		return nil
	}
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("legacy tc trial: this thread's network namespace: %w", err)
			return
		}
		defer orig.Close()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("legacy tc trial: new network namespace: %w", err)
			return
		}
		lo, err := netlink.LinkByIndex(1)
		if err == nil {
			err = EnsureClsact(lo)
		}
		if err == nil {
			err = netlink.FilterReplace(&netlink.BpfFilter{
				FilterAttrs: netlink.FilterAttrs{LinkIndex: 1, Parent: netlink.HANDLE_MIN_EGRESS, Handle: 1, Priority: 1, Protocol: legacyProto},
				Fd:          prog.FD(), Name: "trial", DirectAction: true,
			})
			if err != nil {
				err = parts.WithCode(parts.CodeKernelLacksTCX, fmt.Errorf("legacy tc filter (module cls_bpf; no tcx links before Linux 6.6): %w", err))
			}
		}
		// Back home: the trial's namespace goes with its last reference.
		// If that fails the thread stays locked and the runtime discards it.
		if serr := netns.Set(orig); serr == nil {
			runtime.UnlockOSThread()
		} else if err == nil {
			err = fmt.Errorf("legacy tc trial: back to the network namespace: %w", serr)
		}
		done <- err
	}()
	return <-done
}

// TCAttachHow names how tc programs attach here, for a part's report.
func TCAttachHow() string {
	if UseTCX() {
		return "tcx"
	}
	return "legacy tc (clsact + cls_bpf: no tcx before Linux 6.6)"
}

// AttachTCFilter attaches prog as f in the calling thread's netns (cookie:
// its cookie) and pins prog as its record under dir. A filter of the same
// name and priority already there gets prog in place (RTM_NEWTFILTER
// without NLM_F_EXCL: cls_bpf swaps the program, never a moment without
// one). The device's clsact qdisc is made when missing.
func AttachTCFilter(dir string, cookie uint64, f TCFilter, prog *ebpf.Program) error {
	rec := TCRecord(dir, cookie, f)
	lnk, err := netlink.LinkByIndex(f.Ifindex)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) || errors.Is(err, unix.ENODEV) {
			return ErrDeviceGone
		}
		return fmt.Errorf("device %d: %w", f.Ifindex, err)
	}
	if err := os.MkdirAll(filepath.Dir(rec), 0o700); err != nil {
		return err
	}
	if err := EnsureClsact(lnk); err != nil {
		return err
	}
	filter := &netlink.BpfFilter{
		FilterAttrs: netlink.FilterAttrs{LinkIndex: f.Ifindex, Parent: f.parent(), Handle: f.handle(),
			Priority: f.Prio, Protocol: legacyProto},
		Fd: prog.FD(), Name: f.Name, DirectAction: true,
	}
	if err := netlink.FilterReplace(filter); err != nil {
		if errors.Is(err, unix.ENODEV) {
			return ErrDeviceGone
		}
		return fmt.Errorf("tc filter %s at %s of %s (prio %d): %w", f.Name, f.dir(), lnk.Attrs().Name, f.Prio, err)
	}
	return pinReplace(prog, rec)
}

// EnsureClsact makes the device's clsact qdisc when it has none.
func EnsureClsact(lnk netlink.Link) error {
	qs, err := netlink.QdiscList(lnk)
	if err != nil {
		return fmt.Errorf("qdiscs of %s: %w", lnk.Attrs().Name, err)
	}
	for _, q := range qs {
		if q.Type() == clsactKind {
			return nil
		}
	}
	q := &netlink.GenericQdisc{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: lnk.Attrs().Index,
		Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT}, QdiscType: clsactKind}
	if err := netlink.QdiscAdd(q); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("add a clsact qdisc to %s (module sch_ingress): %w", lnk.Attrs().Name, err)
	}
	return nil
}

// pinReplace pins prog at pin, replacing what is pinned there (a new pin
// renamed over the old: the record never goes missing).
func pinReplace(prog *ebpf.Program, pin string) error {
	tmp := pin + "_next" // bpffs refuses dots in names (EPERM)
	os.Remove(tmp)
	// A clone: Pin of a program pinned elsewhere moves that pin.
	c, err := prog.Clone()
	if err != nil {
		return err
	}
	defer c.Close()
	if err := c.Pin(tmp); err != nil {
		return fmt.Errorf("pin %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, pin); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("pin %s: %w", pin, err)
	}
	return nil
}

// findTC returns f's filter in the calling thread's netns (its handle and
// name, at any priority), or nil.
func findTC(f TCFilter) (*netlink.BpfFilter, error) {
	lnk, err := netlink.LinkByIndex(f.Ifindex)
	if err != nil {
		return nil, nil
	}
	fs, err := netlink.FilterList(lnk, f.parent())
	if err != nil {
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			return nil, nil // no clsact
		}
		return nil, fmt.Errorf("tc filters of %s: %w", lnk.Attrs().Name, err)
	}
	for _, x := range fs {
		if b, ok := x.(*netlink.BpfFilter); ok && b.Handle == f.handle() && b.Name == f.Name {
			return b, nil
		}
	}
	return nil, nil
}

// TCRecords lists the records of legacy tc filters under dir (a family's pin
// directory), in lexical order.
func TCRecords(dir string) ([]string, error) {
	var out []string
	err := filepath.WalkDir(filepath.Join(dir, TCDir), func(path string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) && path == filepath.Join(dir, TCDir) {
			return fs.SkipDir
		}
		if err != nil {
			return err
		}
		if !d.IsDir() && !strings.HasSuffix(d.Name(), "_next") {
			out = append(out, path)
		}
		return nil
	})
	return out, err
}

// ParseTCRecord reads the netns cookie and the filter from a record path.
func ParseTCRecord(rec string) (cookie uint64, f TCFilter, err error) {
	name := filepath.Base(rec)
	ifx, err1 := strconv.Atoi(filepath.Base(filepath.Dir(rec)))
	cookie, err2 := strconv.ParseUint(filepath.Base(filepath.Dir(filepath.Dir(rec))), 10, 64)
	i := strings.LastIndexByte(name, '_')
	if err1 != nil || err2 != nil || i <= 0 || (name[i+1:] != "ingress" && name[i+1:] != "egress") {
		return 0, TCFilter{}, fmt.Errorf("not a tc filter record: %s", rec)
	}
	return cookie, TCFilter{Ifindex: ifx, Ingress: name[i+1:] == "ingress", Name: name[:i]}, nil
}

// DetachTCFilter detaches the filter recorded at rec (in whichever network
// namespace has the recorded cookie; none: it went with its namespace) and
// removes the record.
func DetachTCFilter(rec string) error {
	cookie, f, err := ParseTCRecord(rec)
	if err != nil {
		return err
	}
	err = inNetNSByCookie(cookie, func() error { return detachTC(f) })
	if errors.Is(err, errNoSuchNetNS) {
		err = nil
	}
	if err != nil {
		return err
	}
	if err := os.Remove(rec); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	ifDir := filepath.Dir(rec)
	os.Remove(ifDir)
	os.Remove(filepath.Dir(ifDir))
	return nil
}

func detachTC(f TCFilter) error {
	b, err := findTC(f)
	if err != nil || b == nil {
		return err // none: the device went, and its filters with it
	}
	if err := netlink.FilterDel(b); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("delete tc filter %s at %s of ifindex %d: %w", f.Name, f.dir(), f.Ifindex, err)
	}
	return nil
}

// DetachTCFilters detaches every legacy tc filter recorded under dir and
// removes the records.
func DetachTCFilters(dir string) error {
	recs, err := TCRecords(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, rec := range recs {
		errs = append(errs, DetachTCFilter(rec))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return os.RemoveAll(filepath.Join(dir, TCDir))
}

// DetachTCFiltersUnder detaches the legacy tc filters recorded in every
// pin directory under root (a killed agent's or test's pins, before they
// are removed).
func DetachTCFiltersUnder(root string) error {
	var dirs []string
	filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() && d.Name() == TCDir {
			dirs = append(dirs, filepath.Dir(path))
			return fs.SkipDir
		}
		return nil
	})
	var errs []error
	for _, d := range dirs {
		errs = append(errs, DetachTCFilters(d))
	}
	return errors.Join(errs...)
}

var errNoSuchNetNS = errors.New("no such network namespace")

// InNetNSCookie runs fn in the network namespace with that cookie: this
// process's own, or one of NetNamespaces.
func InNetNSCookie(cookie uint64, fn func() error) error { return inNetNSByCookie(cookie, fn) }

func inNetNSByCookie(cookie uint64, fn func() error) error {
	if own, err := NetNSCookie(""); err == nil && own == cookie {
		return fn()
	}
	paths, err := NetNamespaces()
	if err != nil {
		return err
	}
	for _, p := range paths {
		var c uint64
		if InNetNSPath(p, func() error {
			var err error
			c, err = NetNSCookie("")
			return err
		}) != nil || c != cookie {
			continue
		}
		return InNetNSPath(p, fn)
	}
	return errNoSuchNetNS
}

// TCHook is a program on a device's ingress or egress, as this kernel
// attaches it: a tcx link, or a legacy tc filter (UseTCX false). Pinned
// (recorded), it stays attached after Close; unpinned, Close detaches it,
// as closing an unpinned tcx link does.
type TCHook struct {
	link   link.Link // tcx
	pin    string    // tcx: its pin ("": unpinned)
	filter *TCFilter // legacy
	rec    string    // legacy with a pin directory: its record
	netns  uint64    // legacy unrecorded: the cookie of its network namespace
}

// TCHookOptions says where AttachTCHook attaches.
type TCHookOptions struct {
	Ifindex int
	Ingress bool
	Program *ebpf.Program
	Name    string // the program's name, in pin and record names
	Prio    uint16 // legacy: the filter's priority (lower runs first)
	// Anchor places a tcx link (nil: after other owners' programs).
	Anchor link.Anchor
	// Dir is the family's pin directory ("": nothing pinned) and Cookie the
	// calling thread's netns cookie, for the pin and record paths.
	Dir    string
	Cookie uint64
	// Keep accepts a tcx link found pinned (nil: any); one it refuses is
	// replaced.
	Keep func(*link.Info) bool
}

func (o TCHookOptions) dir() string {
	if o.Ingress {
		return "ingress"
	}
	return "egress"
}

// AttachTCHook attaches o.Program in the calling thread's netns, or gives
// what an earlier agent pinned or recorded there the program in place. It
// returns the hook and its pin or record ("": none).
func AttachTCHook(o TCHookOptions) (*TCHook, string, error) {
	if !UseTCX() {
		f := TCFilter{Ifindex: o.Ifindex, Ingress: o.Ingress, Name: o.Name, Prio: o.Prio}
		if o.Dir == "" {
			cookie, err := NetNSCookie("")
			if err != nil {
				return nil, "", err
			}
			if err := attachTC(f, o.Program); err != nil {
				return nil, "", err
			}
			return &TCHook{filter: &f, netns: cookie}, "", nil
		}
		if err := AttachTCFilter(o.Dir, o.Cookie, f, o.Program); err != nil {
			return nil, "", err
		}
		rec := TCRecord(o.Dir, o.Cookie, f)
		return &TCHook{filter: &f, rec: rec}, rec, nil
	}
	at := ebpf.AttachTCXEgress
	if o.Ingress {
		at = ebpf.AttachTCXIngress
	}
	pin := ""
	if o.Dir != "" {
		pin = LinkPin(o.Dir, KindTCX, strconv.FormatUint(o.Cookie, 10), strconv.Itoa(o.Ifindex), o.Name+"_"+o.dir())
	}
	keep := func(info *link.Info) bool {
		tcx := info.TCX()
		return tcx != nil && int(tcx.Ifindex) == o.Ifindex && ebpf.AttachType(tcx.AttachType) == at && (o.Keep == nil || o.Keep(info))
	}
	l, err := AttachPinned(pin, o.Program, keep, func() (link.Link, error) {
		return link.AttachTCX(link.TCXOptions{Interface: o.Ifindex, Program: o.Program, Attach: at, Anchor: o.Anchor})
	})
	if err != nil {
		if errors.Is(err, unix.ENODEV) || errors.Is(err, unix.ENXIO) {
			return nil, "", ErrDeviceGone
		}
		return nil, "", err
	}
	return &TCHook{link: l, pin: pin}, pin, nil
}

// attachTC attaches f without a record.
func attachTC(f TCFilter, prog *ebpf.Program) error {
	lnk, err := netlink.LinkByIndex(f.Ifindex)
	if err != nil {
		return ErrDeviceGone
	}
	if err := EnsureClsact(lnk); err != nil {
		return err
	}
	err = netlink.FilterReplace(&netlink.BpfFilter{
		FilterAttrs: netlink.FilterAttrs{LinkIndex: f.Ifindex, Parent: f.parent(), Handle: f.handle(), Priority: f.Prio, Protocol: legacyProto},
		Fd:          prog.FD(), Name: f.Name, DirectAction: true,
	})
	if err != nil {
		return fmt.Errorf("tc filter %s at %s of %s (prio %d): %w", f.Name, f.dir(), lnk.Attrs().Name, f.Prio, err)
	}
	return nil
}

// Close drops this process's hold: a pinned or recorded hook stays
// attached; an unpinned one is detached.
func (h *TCHook) Close() error {
	switch {
	case h == nil:
		return nil
	case h.link != nil:
		return h.link.Close()
	case h.rec != "":
		return nil
	default:
		return h.detachUnrecorded()
	}
}

// Detach removes the hook from its device, and its pin or record, wherever
// the caller is.
func (h *TCHook) Detach() error {
	switch {
	case h == nil:
		return nil
	case h.link != nil:
		var err error
		if h.pin != "" {
			err = h.link.Unpin()
			os.Remove(filepath.Dir(h.pin)) // the ifindex and netns directories, once empty
			os.Remove(filepath.Dir(filepath.Dir(h.pin)))
		}
		return errors.Join(err, h.link.Close())
	case h.rec != "":
		return DetachTCFilter(h.rec)
	default:
		return h.detachUnrecorded()
	}
}

func (h *TCHook) detachUnrecorded() error {
	err := inNetNSByCookie(h.netns, h.detachHere)
	if errors.Is(err, errNoSuchNetNS) {
		return nil // gone with its namespace
	}
	return err
}

func (h *TCHook) detachHere() error {
	return detachTC(*h.filter)
}
