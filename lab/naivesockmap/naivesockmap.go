package naivesockmap

import (
	"errors"
	"fmt"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
)

// ProgPrefix starts the name of each of its programs (for their run-time
// statistics).
const ProgPrefix = "ez_naive_"

// Naive is the naive sockmap, loaded and attached to one cgroup: every TCP
// socket of it established from then on is redirected to its peer found by
// address. Nothing is pinned: it goes when closed (and with the process).
type Naive struct {
	objs  naiveObjects
	links []link.Link
}

// Load loads the naive sockmap and attaches it to the cgroup v2 directory
// cgroup. Sockets with either port in skip stay on the kernel path. Close
// detaches it.
func Load(cgroup string, skip ...uint16) (_ *Naive, err error) {
	if slices.Contains(skip, 0) {
		return nil, errors.New("the naive sockmap cannot skip port 0")
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, err
	}
	spec, err := loadNaive()
	if err != nil {
		return nil, err
	}
	// EZ_NAIVE_SKIP_MAX ports, 0 ending the list.
	v := spec.Variables["ez_naive_skip_ports"]
	ports := make([]uint16, v.Size()/2)
	if len(skip) > len(ports) {
		return nil, fmt.Errorf("the naive sockmap skips at most %d ports, not %d", len(ports), len(skip))
	}
	copy(ports, skip)
	if err := v.Set(ports); err != nil {
		return nil, fmt.Errorf("set the skipped ports: %w", err)
	}
	n := &Naive{}
	if err := spec.LoadAndAssign(&n.objs, nil); err != nil {
		return nil, fmt.Errorf("load the naive sockmap: %+v", err)
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, n.Close())
		}
	}()
	// The sk_msg program on the tuple map only: a socket's psock takes
	// its programs from that map (bpf/naive/naive.bpf.c).
	msg, err := link.AttachRawLink(link.RawLinkOptions{Target: n.objs.EzNaiveByTuple.FD(),
		Program: n.objs.EzNaiveMsg, Attach: ebpf.AttachSkMsgVerdict})
	if err != nil {
		return nil, fmt.Errorf("attach sk_msg: %w", err)
	}
	n.links = append(n.links, msg)
	ops, err := link.AttachCgroup(link.CgroupOptions{Path: cgroup, Attach: ebpf.AttachCGroupSockOps, Program: n.objs.EzNaiveSockops})
	if err != nil {
		return nil, fmt.Errorf("attach sockops to %s: %w", cgroup, err)
	}
	n.links = append(n.links, ops)
	return n, nil
}

// Close detaches the programs (sockops first: no new socket) and frees
// the maps; sockets in them lose their psock and take the kernel path.
func (n *Naive) Close() error {
	var errs []error
	for i := len(n.links) - 1; i >= 0; i-- {
		errs = append(errs, n.links[i].Close())
	}
	n.links = nil
	errs = append(errs, n.objs.Close())
	return errors.Join(errs...)
}

// counterNames name the counters (enum ez_naive_counter).
var counterNames = map[naiveEzNaiveCounter]string{
	naiveEzNaiveCounterEZ_NAIVE_C_INSERTED:    "inserted",
	naiveEzNaiveCounterEZ_NAIVE_C_INSERT_FAIL: "insert_fail",
	naiveEzNaiveCounterEZ_NAIVE_C_BY_TUPLE:    "redirect_by_tuple",
	naiveEzNaiveCounterEZ_NAIVE_C_BY_CLIENT:   "redirect_by_client",
	naiveEzNaiveCounterEZ_NAIVE_C_PASS:        "pass",
	naiveEzNaiveCounterEZ_NAIVE_C_SKIPPED:     "skipped",
}

// Counters are the counters summed over CPUs, by name.
func (n *Naive) Counters() (map[string]uint64, error) {
	out := map[string]uint64{}
	for c, name := range counterNames {
		var per []uint64
		if err := n.objs.EzNaiveCounters.Lookup(uint32(c), &per); err != nil {
			return nil, fmt.Errorf("counter %s: %w", name, err)
		}
		for _, v := range per {
			out[name] += v
		}
	}
	return out, nil
}

// Redirected is how many messages it redirected, from counters.
func Redirected(c map[string]uint64) uint64 {
	return c["redirect_by_tuple"] + c["redirect_by_client"]
}
