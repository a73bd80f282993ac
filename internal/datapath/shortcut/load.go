package shortcut

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
	"github.com/eztunnel/eztunnel/internal/parts"
)

// Requirements lists what the socket shortcut needs of the kernel and process
// before anything loads; each program's own load (programGroups) then names
// what a kernel refuses. Optional parts (NAT: netfilter links, Linux 6.4;
// RST on close: tcx, Linux 6.6) are not here: they turn off alone.
var Requirements = []bpfsys.Requirement{
	{Name: "root (CAP_BPF, CAP_NET_ADMIN, CAP_SYS_ADMIN)", Check: bpfsys.Root},
	{Name: "kernel BTF (/sys/kernel/btf/vmlinux)", Check: bpfsys.BTF},
	{Name: "program type sock_ops", Check: bpfsys.ProgType(ebpf.SockOps)},
	{Name: "program type sk_msg", Check: bpfsys.ProgType(ebpf.SkMsg)},
	{Name: "program type cgroup_skb", Check: bpfsys.ProgType(ebpf.CGroupSKB)},
	{Name: "program type sched_cls (release by BPF_PROG_TEST_RUN)", Check: bpfsys.ProgType(ebpf.SchedCLS)},
	{Name: "map type sockhash", Check: bpfsys.MapType(ebpf.SockHash)},
	{Name: "map type sk_storage", Check: bpfsys.MapType(ebpf.SkStorage)},
	{Name: "helper bpf_msg_redirect_hash (sk_msg)", Check: bpfsys.Helper(ebpf.SkMsg, asm.FnMsgRedirectHash)},
	{Name: "helper bpf_sk_storage_get (sk_msg)", Check: bpfsys.Helper(ebpf.SkMsg, asm.FnSkStorageGet)},
	{Name: "helper bpf_get_netns_cookie (sock_ops)", Check: bpfsys.Helper(ebpf.SockOps, asm.FnGetNetnsCookie)},
}

// Config sizes the maps and selects connections.
type Config struct {
	MaxSockets uint32 // entries of the sockhash (two per accelerated connection)
	MaxPairs   uint32 // connections being set up at once
	// MaxUnread bounds the bytes a direction may have redirected and not
	// read before the connection switches to the kernel path; 0: per
	// receiver, what plain TCP would let it hold (bpf/lib/bound.h).
	MaxUnread uint32
	Select    Selection
	// CgroupFilter enrols only sockets of the cgroups SetScope selected
	// (and their descendants); without it every socket of an attached
	// cgroup subtree may enrol.
	CgroupFilter bool
	// CoveredOnly enrols a socket only once its network namespace is
	// covered (bpf/shortcut/coverage.h): where the close reset runs, its
	// devices are then only those of covered namespaces (datapath's
	// --close-reset-devices=covered).
	CoveredOnly bool
}

// MaxUnread limits: below one socket page-frag refill every write would
// switch; above 1 GiB the bound no longer protects a node.
const (
	MinMaxUnread = 64 << 10
	MaxMaxUnread = 1 << 30
)

// Validate rejects a configuration before anything is loaded.
func (c Config) Validate() error {
	if c.MaxSockets < 2 || c.MaxSockets > 1<<24 {
		return fmt.Errorf("max sockets %d out of range [2, %d]", c.MaxSockets, 1<<24)
	}
	if c.MaxPairs < 1 || c.MaxPairs > 1<<24 {
		return fmt.Errorf("max pairs %d out of range [1, %d]", c.MaxPairs, 1<<24)
	}
	if c.MaxUnread != 0 && (c.MaxUnread < MinMaxUnread || c.MaxUnread > MaxMaxUnread) {
		return fmt.Errorf("max unread (--max-unread) %d bytes out of range: 0 (per receiver) or [%d, %d]", c.MaxUnread, MinMaxUnread, MaxMaxUnread)
	}
	return c.Select.Validate()
}

// Shortcut is the loaded socket shortcut. Its maps and links are pinned in
// its directory: closing it releases this process's handles only.
type Shortcut struct {
	dir    string
	objs   shortcutObjects
	pruned []uint64 // cgroups the last Attach detached (no longer wanted)
	// This process's handles on cgroup links, by cgroup id: a link stays
	// attached while a pin or a handle holds it, so pruning closes these.
	cgLinks map[uint64][]link.Link
	// This process's handles on the close-reset device links, by pin.
	devLinks map[string]link.Link
	// The legacy tc filters of close-reset this process attached or
	// updated, by record (kernels without tcx: bpfsys.AttachTCFilter).
	devFilters map[string]bool
	// The cgroup programs of the earlier install, from their pins, while an
	// Attach or ReconcileCgroups runs.
	prevProgs map[string]*ebpf.Program
	links     []link.Link
	instance  uint32     // ez_cfg_instance of this load (recv.h)
	adoptScan *link.Iter // ez_sc_adopt_scan and ez_sc_adopt_step (adopt.go), attached on first use
	adoptStep *link.Iter
	// adoptPasses: step passes per round (3; fewer only through
	// InterruptAdoptionAfter, for tests).
	adoptPasses int
	// adoptSettled: the last round ran its passes over every namespace
	// and left no end mid-adoption, so a round with no candidate needs
	// none (false until this process's first round has run them: a
	// killed agent's round may have left ends to hand back).
	adoptSettled bool
	// indexPruned: when AgePairs last walked the connection index
	// (CLOCK_MONOTONIC ns; 0: never).
	indexPruned uint64
	// What the last ReleaseSwitched pass left: the backpressure counter it
	// saw and the switched sockets it found still waiting. A pass with no
	// new switch and none waiting would walk the sockhash for nothing.
	switchesSeen uint64
	waiting      int64
	parts        parts.Report // which parts loaded (load)
	gauge        bool         // reads are not counted: the bound gauges the receiver (rxGauge)
	coveredOnly  bool         // sockets enrol only in covered namespaces (Config.CoveredOnly, with the close reset)
	cgroupFilter bool         // Config.CgroupFilter
}

// Load loads the programs, reusing the maps pinned in dir by an installed
// shortcut of the same schema (so a restart or upgrade keeps every
// connection's state) and pinning new ones there. dir must exist; cfg is
// validated by its caller (datapath.Install, which runs Config.Validate).
func Load(cfg Config, dir string) (*Shortcut, error) {
	spec, err := loadShortcut()
	if err != nil {
		return nil, fmt.Errorf("datapath: parse embedded object: %w", err)
	}
	var specs shortcutSpecs
	if err := spec.Assign(&specs); err != nil {
		return nil, fmt.Errorf("datapath: %w", err)
	}
	specs.EzScSockets.MaxEntries = cfg.MaxSockets
	specs.EzScPairs.MaxEntries = cfg.MaxPairs
	specs.EzScAliases.MaxEntries = cfg.MaxPairs
	specs.EzScSynIndex.MaxEntries = cfg.MaxPairs
	specs.EzScProofs.MaxEntries = cfg.MaxPairs
	specs.EzScUnreads.MaxEntries = max(cfg.MaxSockets/2, 1)
	specs.EzScCgroups.MaxEntries = MaxScope
	flags := cfg.Select.flags()
	if cfg.CgroupFilter {
		flags |= uint32(shortcutEzCfgFlagEZ_CFG_CGROUP_FILTER)
	}
	gauge := rxGauge()
	if gauge {
		flags |= uint32(shortcutEzCfgFlagEZ_CFG_RX_GAUGE)
	}
	if KernelBackpressure() == nil {
		flags |= uint32(shortcutEzCfgFlagEZ_CFG_KERNEL_BP)
	}
	if natTC() == nil {
		flags |= uint32(shortcutEzCfgFlagEZ_CFG_NAT_TC)
	} else {
		withoutConntrackKfuncs(spec.Programs[shortcutProgEzScCloseReset])
	}
	specs.EzScRxSocks.MaxEntries = cfg.MaxSockets
	specs.EzScRx.MaxEntries = cfg.MaxSockets
	specs.EzScIndex.MaxEntries = cfg.MaxSockets
	instance := rand.Uint32() | 1 // never 0, the owner slot's initial value
	slack, err := tcpMemSlack()
	if err != nil {
		return nil, fmt.Errorf("datapath: %w", err)
	}
	for v, val := range map[*ebpf.VariableSpec]uint32{
		specs.EzCfgFlags:     flags,
		specs.EzCfgMaxUnread: cfg.MaxUnread,
		specs.EzCfgInstance:  instance,
		// splice.h: the syscalls whose entry the splice guard watches.
		specs.EzCfgNrSplice:   uint32(unix.SYS_SPLICE),
		specs.EzCfgNrSendfile: uint32(unix.SYS_SENDFILE),
		// skmsg.h tx_mem_pressure: what the per-CPU caches hold back.
		specs.EzCfgMemSlack: slack,
	} {
		if err := v.Set(val); err != nil {
			return nil, fmt.Errorf("datapath: %w", err)
		}
	}
	// ez_sc_nat_dev learns from this namespace's devices (bpf/shortcut/nat.h).
	netns, err := bpfsys.NetNSCookie("")
	if err != nil {
		return nil, fmt.Errorf("datapath: %w", err)
	}
	if err := specs.EzCfgNatNetns.Set(netns); err != nil {
		return nil, fmt.Errorf("datapath: %w", err)
	}
	// Selection rule maps are left unpinned: every load writes its own.
	for _, name := range pinnedMaps {
		spec.Maps[name].Pinning = ebpf.PinByName
	}

	// A build with more counters loads over the smaller pinned ones (an
	// upgrade in place).
	if err := bpfsys.GrowPinnedCounters(dir, spec, shortcutMapEzScCounters, shortcutMapEzScAdoptCounters, shortcutMapEzScResetCounters); err != nil {
		return nil, fmt.Errorf("datapath: %w", err)
	}
	s := &Shortcut{dir: dir, instance: instance, cgLinks: map[uint64][]link.Link{}, devLinks: map[string]link.Link{}, devFilters: map[string]bool{}, adoptPasses: 3, gauge: gauge, cgroupFilter: cfg.CgroupFilter}
	if err := s.load(spec, &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: dir}}); err != nil {
		return nil, err
	}
	if err := s.writeSelection(cfg.Select); err != nil {
		s.objs.Close()
		return nil, fmt.Errorf("datapath: %w", err)
	}
	// Before any program is attached: until SyncCoverage, nothing is covered.
	if cfg.CoveredOnly && s.objs.EzScCloseReset != nil {
		if err := s.objs.EzCoveredOnly.Set(uint32(1)); err != nil {
			s.objs.Close()
			return nil, fmt.Errorf("datapath: %w", err)
		}
		s.coveredOnly = true
	}
	return s, nil
}

// programGroups are the shortcut's programs by the part they serve. The
// first three are the shortcut itself: without reads counted or gauged (the
// unread bound, invariant 4) or a way to hand sockets back (uninstall,
// switches), the shortcut does not run. Each other group is optional: a
// kernel that refuses one of its programs turns off that part only. gauge:
// neither read counter can run here (rxGauge).
func programGroups(gauge bool) []bpfsys.Group {
	read := readGroup(gauge)
	reset := bpfsys.Group{Part: parts.CloseReset, Progs: []string{shortcutProgEzScSockRelease, shortcutProgEzScCloseReset},
		Via: "cgroup/sock_release + " + bpfsys.TCAttachHow(), Attach: bpfsys.TCAttachable}
	if gauge {
		reset.Via = "cgroup/sock_release asking the closing socket's psock queue (no counted reads) + " + bpfsys.TCAttachHow()
	}
	kbp := bpfsys.Group{Part: parts.KernelBP, Via: "tcp_bpf makes a sender wait while the receiver holds more than its sk_rcvbuf (" + kernelBPFunc + ")"}
	if err := KernelBackpressure(); err != nil {
		kbp.Off = fmt.Errorf("a receiver that falls --max-unread behind moves its connection to the kernel path for good: %w", err)
	}
	adopt := bpfsys.Group{Part: parts.Adoption, Progs: []string{shortcutProgEzScAdoptScan, shortcutProgEzScAdoptStep}, Via: "iter/tcp per network namespace"}
	// The programs load on older kernels, but there bpf_setsockopt refuses
	// TCP_BPF_SOCK_OPS_CB_FLAGS (net/core/filter.c, sol_tcp_sockopt) at run
	// time, so no tripwire could be armed.
	if err := bpfsys.EnumValue("TCP_BPF_SOCK_OPS_CB_FLAGS")(); err != nil {
		adopt = bpfsys.Group{Part: parts.Adoption, Off: parts.WithCode(parts.CodeKernelLacksFeature,
			fmt.Errorf("arming a connection needs bpf_setsockopt(TCP_BPF_SOCK_OPS_CB_FLAGS) from an iterator (Linux 6.10): %w", err))}
	}
	return []bpfsys.Group{
		{Part: parts.Shortcut, Required: true, Progs: []string{shortcutProgEzScSockops, shortcutProgEzScEgress, shortcutProgEzScMsg},
			Via: "sockops + sk_msg + sockhash, cgroup_skb egress"},
		read,
		spliceGroup(),
		kbp,
		{Part: parts.Release, Required: true, Progs: []string{shortcutProgEzScReleaseSwitched, shortcutProgEzScRelease},
			Via: "tc programs run by BPF_PROG_TEST_RUN"},
		natGroup(natTC()),
		reset,
		adopt,
		{Part: parts.Connections, Progs: []string{shortcutProgEzScConnsAll}, Via: connsAllVia, Fallback: &bpfsys.Group{
			Progs: []string{shortcutProgEzScConns}, Via: connsPerNetnsVia}},
	}
}

// confirmFunc is the kernel function ez_sc_nat_ct enters: conntrack's
// confirmation of a new entry, once per connection (bpf/shortcut/nat.h).
const confirmFunc = "__nf_conntrack_confirm"

// natHook reports, nil or why not, whether ez_sc_nat_ct can run here: the
// host lets this process attach fentry programs, and nf_conntrack is loaded
// (built in, or a module). A test refuses it by naming the program in
// bpfsys.TestRefuseEnv.
func natHook() error {
	if err := bpfsys.TestRefusal(shortcutProgEzScNatCt); err != nil {
		return err
	}
	return bpfsys.Fentry(confirmFunc)()
}

// natTCName is what a test names in bpfsys.TestRefuseEnv to refuse the
// learning at SYN-ACKs by the close reset's tc program (natTC).
const natTCName = "ez_sc_nat_tc"

// natTCVia is the shortcut-nat part's Via when the close reset's tc program
// learns the node's NAT (natTC).
const natTCVia = "ez_sc_close_reset's tc links, at SYN-ACKs from pods (a conntrack lookup once per connection; no NAT hook)"

// natTC reports, nil or why not, whether the close reset's tc program
// learns the node's NAT at SYN-ACKs (EZ_CFG_NAT_TC, bpf/shortcut/nat.h)
// instead of a NAT hook: where the fentry cannot run, and the conntrack
// kfuncs are there (nf_conntrack built in or loaded). The tc program runs
// for every packet of the pods' veths anyway; the netfilter link would run
// once more per packet. The close reset must load too (load checks).
func natTC() error {
	if natHook() == nil {
		return errors.New("the fentry learns")
	}
	if err := bpfsys.TestRefusal(natTCName); err != nil {
		return err
	}
	return conntrackKfuncs()
}

// conntrackKfuncs reports, nil or why not, whether the kernel has the
// conntrack kfuncs (net/netfilter/nf_conntrack_bpf.c): in vmlinux's BTF
// (built in) or nf_conntrack's (a loaded module).
func conntrackKfuncs() error {
	const fn = "bpf_skb_ct_lookup"
	if bpfsys.KernelFunc(fn)() == nil {
		return nil
	}
	spec, err := btf.LoadKernelModuleSpec("nf_conntrack")
	if err != nil {
		return fmt.Errorf("no conntrack kfuncs (nf_conntrack not loaded?): %w", err)
	}
	var f *btf.Func
	if err := spec.TypeByName(fn, &f); err != nil {
		return fmt.Errorf("no %s in nf_conntrack's BTF: %w", fn, err)
	}
	return nil
}

// withoutConntrackKfuncs replaces the conntrack kfunc calls of ps (the
// close reset's SYN-ACK learning, bpf/shortcut/nat.h) by r0 = 0 and their
// address loads by 0: without EZ_CFG_NAT_TC that code is dead, and a
// program without kfunc calls loads where they cannot be resolved or a
// JIT cannot call them, as the close reset did before it learnt.
func withoutConntrackKfuncs(ps *ebpf.ProgramSpec) {
	if ps == nil {
		return
	}
	for i, ins := range ps.Instructions {
		var n asm.Instruction
		switch ref := ins.Reference(); {
		case ref != "bpf_skb_ct_lookup" && ref != "bpf_ct_release":
			continue
		case ins.IsKfuncCall():
			n = asm.Mov.Imm(asm.R0, 0)
		case ins.OpCode.IsDWordLoad():
			n = asm.LoadImm(ins.Dst, 0, asm.DWord)
		default:
			continue
		}
		n = n.WithSymbol(ins.Symbol())
		if src := ins.Source(); src != nil {
			n = n.WithSource(src)
		}
		ps.Instructions[i] = n
	}
}

// natGroup is the shortcut-nat part (bpf/shortcut/nat.h), its hook best
// first: fentry on __nf_conntrack_confirm (once per new connection); where
// it cannot run, the close reset's tc program at SYN-ACKs (natTC: no
// program of its own); the netfilter link at POST_ROUTING (every packet;
// Linux 6.4), tp_btf/net_dev_queue (every transmit). Where the fentry
// cannot run, the hook used names why. tc: natTC's answer.
func natGroup(tc error) bpfsys.Group {
	if tc == nil {
		return bpfsys.Group{Part: parts.ShortcutNAT, Via: fmt.Sprintf("%s (%v)", natTCVia, natHook())}
	}
	return natHookGroup(tc)
}

// natHookGroup is natGroup with a NAT hook of its own; tc is why the close
// reset's tc program does not learn (natTC), named in the Via where the
// fentry cannot run either.
func natHookGroup(tc error) bpfsys.Group {
	dev := bpfsys.Group{Progs: []string{shortcutProgEzScNatDev}, Via: "tp_btf/net_dev_queue of the node's devices (runs for every transmit)"}
	nf := bpfsys.Group{Progs: []string{shortcutProgEzScNat}, Via: "netfilter link at POST_ROUTING (runs for every packet the node forwards or sends)", Fallback: &dev}
	if err := natHook(); err != nil {
		err = fmt.Errorf("%w; SYN-ACKs: %v", err, tc)
		nf.Via = fmt.Sprintf("%s (%v)", nf.Via, err)
		dev.Via = fmt.Sprintf("%s (%v)", dev.Via, err)
		g := nf
		g.Part = parts.ShortcutNAT
		return g
	}
	return bpfsys.Group{Part: parts.ShortcutNAT, Progs: []string{shortcutProgEzScNatCt},
		Via: "fentry/" + confirmFunc + " (runs once per new connection)", Fallback: &nf}
}

// kernelBPFunc is the function the kernel change of kernel/patches adds: a
// socket with an sk_msg program has no room to send while the socket it
// redirects into with BPF_F_INGRESS holds more than its receive buffer.
const kernelBPFunc = "tcp_bpf_stream_memory_free"

// KernelBackpressure reports, nil or why not, whether this kernel makes a
// sender whose sk_msg redirects into its peer's receive queue wait as plain
// TCP does (kernel/patches). Then a slow reader holds its writer instead of
// switching the connection to the kernel path (EZ_CFG_KERNEL_BP), and bulk
// transfers keep the shortcut. A test refuses it by naming it in
// EZTUNNEL_TEST_REFUSE_PROGRAMS.
func KernelBackpressure() error {
	if err := bpfsys.TestRefusal(kernelBPFunc); err != nil {
		return err
	}
	if err := bpfsys.KernelFunc(kernelBPFunc)(); err != nil {
		return parts.WithCode(parts.CodeKernelLacksFeature, fmt.Errorf("the kernel does not make an sk_msg ingress redirect's sender wait (%w; kernel/patches adds it)", err))
	}
	return nil
}

// recvFunc is the kernel function ez_sc_recv_fx exits from: sk_prot->recvmsg
// of a TCP socket with a psock and no stream parser (net/ipv4/tcp_bpf.c).
const recvFunc = "tcp_bpf_recvmsg"

// readHooks reports, nil or why not, whether each hook that counts reads
// can run here (bpf/shortcut/recv.h), best first: fexit on tcp_bpf_recvmsg
// runs only for sockets with a psock; tp_btf/sock_recv_length (Linux 6.3)
// for every recvmsg on the node. A test refuses either by naming its
// program in bpfsys.TestRefuseEnv.
func readHooks() (fexit, tracepoint error) {
	if fexit = bpfsys.TestRefusal(shortcutProgEzScRecvFx); fexit == nil {
		fexit = bpfsys.Fexit(recvFunc)()
	}
	if tracepoint = bpfsys.TestRefusal(shortcutProgEzScRecv); tracepoint == nil {
		tracepoint = bpfsys.Tracepoint("sock_recv_length")()
	}
	return fexit, tracepoint
}

// rxGauge reports whether reads cannot be counted here, so the unread bound
// gauges the receiver instead (bpf/shortcut/unread.h, ez_sc_rx_socks):
// neither hook of readHooks can run.
func rxGauge() bool {
	fexit, tracepoint := readHooks()
	return fexit != nil && tracepoint != nil
}

// readGroup is the read-accounting part: the fexit where it loads (the
// tracepoint as its fallback), else the tracepoint with the fexit's refusal
// in its Via; gauge: neither (rxGauge).
func readGroup(gauge bool) bpfsys.Group {
	g := bpfsys.Group{Part: parts.ReadAccounting, Required: true}
	fexit, tracepoint := readHooks()
	tp := bpfsys.Group{Progs: []string{shortcutProgEzScRecv}, Via: "tp_btf/sock_recv_length (runs for every recvmsg on the node)"}
	switch {
	case gauge:
		g.Via = fmt.Sprintf("gauge: the sender reads the receiver's sk_rmem_alloc (%v; %v)", fexit, tracepoint)
	case fexit != nil:
		g.Progs, g.Via = tp.Progs, fmt.Sprintf("%s (%v)", tp.Via, fexit)
	default:
		g.Progs, g.Via = []string{shortcutProgEzScRecvFx}, "fexit/"+recvFunc+" (runs only for sockets with a psock)"
		if tracepoint == nil {
			g.Fallback = &tp
		}
	}
	return g
}

// load loads the maps, then each program on its own (bpfsys.Programs),
// recording each part's status in s.parts. A required part that fails fails
// the load, naming the program.
func (s *Shortcut) load(spec *ebpf.CollectionSpec, opts *ebpf.CollectionOptions) error {
	ps, err := bpfsys.LoadMaps(spec, opts)
	if err != nil {
		if errors.Is(err, ebpf.ErrMapIncompatible) {
			return fmt.Errorf("datapath: pinned maps in %s do not match this build (map sizes or schema changed); run `eztunnel uninstall` first: %w", s.dir, err)
		}
		return fmt.Errorf("datapath: load maps: %w", err)
	}
	defer ps.Close()
	loaded, err := ps.LoadGroups(programGroups(s.gauge), &s.parts)
	if err != nil {
		return fmt.Errorf("datapath: %w", err)
	}
	// The close reset's tc program learns the node's NAT (natTC): without
	// it a NAT hook does.
	if natTC() == nil && loaded[shortcutProgEzScCloseReset] == nil {
		more, err := ps.LoadGroups([]bpfsys.Group{natHookGroup(errors.New("the close reset did not load"))}, &s.parts)
		if err != nil {
			bpfsys.CloseAll(loaded)
			return fmt.Errorf("datapath: %w", err)
		}
		maps.Copy(loaded, more)
	}
	// ez_sc_release runs only at uninstall (drain.go), the listing's
	// iterators only for `eztunnel connections`: loaded here to prove they
	// load, then closed.
	for _, name := range []string{shortcutProgEzScRelease, shortcutProgEzScConns, shortcutProgEzScConnsAll} {
		if p := loaded[name]; p != nil {
			p.Close()
			delete(loaded, name)
		}
	}
	// Assign takes the maps and variables out of ps.Coll (its Close no
	// longer closes them).
	if err := ps.Coll.Assign(&s.objs.shortcutMaps); err != nil {
		bpfsys.CloseAll(loaded)
		return fmt.Errorf("datapath: %w", err)
	}
	if err := ps.Coll.Assign(&s.objs.shortcutVariables); err != nil {
		s.objs.shortcutMaps.Close()
		bpfsys.CloseAll(loaded)
		return fmt.Errorf("datapath: %w", err)
	}
	bpfsys.AssignPrograms(loaded, &s.objs.shortcutPrograms)
	return nil
}

// Probe reports which of the shortcut's parts can run here: each group is
// loaded on its own against fresh, small, unpinned maps and closed again.
// A required part that cannot load turns the shortcut off with its reason.
func Probe() parts.Report {
	var rep parts.Report
	spec, err := loadShortcut()
	gauge := rxGauge()
	if err == nil && gauge {
		err = spec.Variables[shortcutVarEzCfgFlags].Set(uint32(shortcutEzCfgFlagEZ_CFG_RX_GAUGE))
	}
	if err == nil {
		withoutConntrackKfuncs(spec.Programs[shortcutProgEzScCloseReset]) // EZ_CFG_NAT_TC is off here
	}
	if err == nil {
		for _, m := range spec.Maps {
			if m.MaxEntries > 64 && m.Type != ebpf.PerCPUArray && m.Type != ebpf.Array {
				m.MaxEntries = 64
			}
		}
	}
	var ps *bpfsys.Programs
	if err == nil {
		ps, err = bpfsys.LoadMaps(spec, nil)
	}
	if err != nil {
		for _, g := range programGroups(gauge) {
			rep.OffErr(g.Part, fmt.Errorf("load maps: %w", err))
		}
		return rep
	}
	defer ps.Close()
	var required []parts.Name
	all := programGroups(gauge)
	groups := make([]bpfsys.Group, len(all))
	for i, g := range all {
		groups[i] = g
		groups[i].Required = false
		if g.Required {
			required = append(required, g.Part)
		}
	}
	loaded, _ := ps.LoadGroups(groups, &rep)
	defer bpfsys.CloseAll(loaded)
	if natTC() == nil && !rep.Runs(parts.CloseReset) {
		more, _ := ps.LoadGroups([]bpfsys.Group{natHookGroup(errors.New("the close reset did not load"))}, &rep) // as load does
		defer bpfsys.CloseAll(more)
	}
	for _, p := range required[1:] {
		if !rep.Runs(p) && rep.Runs(parts.Shortcut) {
			rep.Off(parts.Shortcut, parts.CodeNeedsPart, fmt.Sprintf("needs %s: %s", p, reasonOf(rep, p)))
		}
	}
	return rep
}

func reasonOf(r parts.Report, p parts.Name) string {
	st, _ := r.Get(p)
	return st.Reason
}

// Parts reports which of the shortcut's parts loaded, and why others did not.
func (s *Shortcut) Parts() parts.Report { return s.parts }

// Attach attaches the shortcut within tx: sk_msg on the sockhash (once),
// ez_sc_nat on POST_ROUTING, ez_sc_recv on tp_btf/sock_recv_length, then ez_sc_egress
// and ez_sc_sockops on every cgroup (so reads are counted before any
// connection can pair). Pinned links of an earlier install are updated in place.
func (s *Shortcut) Attach(tx *bpfsys.Tx, cgroups []string) error {
	if err := s.attachMsg(tx); err != nil {
		return err
	}
	if err := s.attachNAT(tx); err != nil {
		return err
	}
	if err := s.attachRecv(tx); err != nil {
		return err
	}
	if err := s.attachSplice(tx); err != nil {
		return err
	}
	if err := s.pinCgroupPrograms(tx); err != nil {
		return err
	}
	want := map[uint64]bool{}
	for _, cg := range cgroups {
		id, err := s.attachCgroup(tx, cg)
		if err != nil {
			return err
		}
		want[id] = true
	}
	return s.pruneCgroups(tx, want)
}

// pruneCgroups detaches, once tx commits, the links pinned for cgroups not
// in want: cgroups an earlier agent was told to manage and this one is not,
// and cgroups removed since (their links are defunct).
func (s *Shortcut) pruneCgroups(tx *bpfsys.Tx, want map[uint64]bool) error {
	ids, err := AttachedCgroups(s.dir)
	if err != nil {
		return err
	}
	s.pruned = s.pruned[:0]
	for _, id := range ids {
		if !want[id] {
			s.pruned = append(s.pruned, id)
		}
	}
	tx.OnCommit(func() error {
		var errs []error
		for _, id := range s.pruned {
			for _, l := range s.cgLinks[id] {
				errs = append(errs, l.Close())
			}
			delete(s.cgLinks, id)
			errs = append(errs, DetachCgroup(s.dir, id))
		}
		return errors.Join(errs...)
	})
	return nil
}

// Pruned lists the cgroup ids whose links the last Attach detached.
func (s *Shortcut) Pruned() []uint64 { return slices.Clone(s.pruned) }

// Close releases this process's handles and joins their errors. Pinned
// state stays.
func (s *Shortcut) Close() error {
	var errs []error
	for _, it := range []**link.Iter{&s.adoptScan, &s.adoptStep} {
		if *it != nil {
			errs = append(errs, (*it).Close())
			*it = nil
		}
	}
	for i := len(s.links) - 1; i >= 0; i-- {
		errs = append(errs, s.links[i].Close())
	}
	s.links = nil
	for pin, l := range s.devLinks {
		errs = append(errs, l.Close())
		delete(s.devLinks, pin)
	}
	for id, ls := range s.cgLinks {
		for _, l := range ls {
			errs = append(errs, l.Close())
		}
		delete(s.cgLinks, id)
	}
	return errors.Join(append(errs, s.objs.Close())...)
}

// ReleaseSwitched runs ez_sc_release_switched over the sockhash once: ends of
// connections that switched to the kernel path (backpressure, half-close)
// leave the sockhash once nothing redirected to them is unread. sockops does
// this at the socket's next segment; this is the backstop for sockets that
// see none. busy says whether there was anything to do: a new switch, or
// switched ends still waiting for their reader.
func (s *Shortcut) ReleaseSwitched() (busy bool, err error) {
	switches, err := readCounter(s.objs.EzScCounters, shortcutEzCounterEZ_C_FB_BACKPRESSURE)
	if err != nil {
		return false, err
	}
	halfCloses, err := readCounter(s.objs.EzScCounters, shortcutEzCounterEZ_C_FB_HALF_CLOSE)
	if err != nil {
		return false, err
	}
	switches += halfCloses
	if switches == s.switchesSeen && s.waiting == 0 {
		return false, nil
	}
	// Switched sockets it had to leave in the sockhash (bytes still
	// unread) need another pass.
	_, waiting, err := releasePass(s.objs.EzScReleaseSwitched, s.objs.EzScSockets)
	if err != nil {
		return true, err
	}
	s.switchesSeen, s.waiting = switches, int64(waiting)
	return true, nil
}

// tcpMemSlack is how many pages of TCP memory the kernel's per-CPU caches
// may hold back from the global count tcp_mem is compared with: each
// possible CPU less than net.core.mem_pcpu_rsv (Linux 6.9+), before that
// the fixed 1 MiB of SK_MEMORY_PCPU_RESERVE (include/net/proto_memory.h).
func tcpMemSlack() (uint32, error) {
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		return 0, err
	}
	rsv := uint64(1<<20) / uint64(os.Getpagesize())
	if b, err := os.ReadFile("/proc/sys/net/core/mem_pcpu_rsv"); err == nil {
		v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 32)
		if err != nil {
			return 0, fmt.Errorf("net.core.mem_pcpu_rsv: %w", err)
		}
		rsv = v
	} else if !errors.Is(err, os.ErrNotExist) {
		return 0, err
	}
	return uint32(min(uint64(cpus)*rsv, math.MaxUint32)), nil
}
