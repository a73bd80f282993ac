package services

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
)

// gone is a backend that left frontend id, with the sockets to destroy
// (bpf/services/destroy.h).
type gone struct {
	id    uint32
	b     Backend
	flags servicesEzSvcGoneFlag
}

// SetNetNS sets how the LB finds the network namespaces whose sockets it
// may have translated (nsfs paths; the agent lists those of the managed
// cgroups' processes). Unset: the caller's namespace only.
func (lb *LB) SetNetNS(list func() ([]string, error)) {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	lb.netns = list
}

// destroy destroys the sockets translated to the backends in gs (lb.mu
// held): it writes the pairs in ez_svc_gone, runs the TCP and UDP
// iterators in every namespace, then removes the pairs. Errors are logged:
// the frontend is written already, and a socket left is what kube-proxy
// would leave.
func (lb *LB) destroy(gs []gone) {
	if len(gs) == 0 {
		return
	}
	var keys []servicesEzSvcGoneKey
	for _, g := range gs {
		k := servicesEzSvcGoneKey{Addr: as16(g.b.Addr()), Port: g.b.Port(), Id: g.id}
		if err := lb.objs.EzSvcGone.Put(k, uint32(g.flags)); err != nil {
			slog.Warn("services: sockets of a removed backend not destroyed", "backend", g.b.String(), "err", err)
			continue
		}
		keys = append(keys, k)
	}
	defer func() {
		for _, k := range keys {
			lb.objs.EzSvcGone.Delete(k)
		}
	}()
	nss := []string{""}
	if lb.netns != nil {
		var err error
		if nss, err = lb.netns(); err != nil {
			slog.Warn("services: sockets of a removed backend: list namespaces", "err", err)
			return
		}
	}
	for _, ns := range nss {
		run := func() error { return lb.runDestroy() }
		var err error
		if ns == "" {
			err = run()
		} else {
			err = bpfsys.InNetNSPath(ns, run)
		}
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			slog.Warn("services: sockets of a removed backend", "netns", ns, "err", err)
		}
	}
}

// runDestroy runs both iterators once in the caller's network namespace
// (a socket iterator walks the namespace it is created in).
func (lb *LB) runDestroy() error {
	if lb.objs.EzSvcDestroyTcp == nil && lb.objs.EzSvcGoneTcp != nil {
		return lb.runDestroyDiag()
	}
	if lb.objs.EzSvcDestroyTcp == nil {
		return nil // socket destruction is off on this kernel (lb.parts): the sockets stay until they close
	}
	for _, p := range []*ebpf.Program{lb.objs.EzSvcDestroyTcp, lb.objs.EzSvcDestroyUdp} {
		if _, err := runIter(p); err != nil {
			return err
		}
	}
	return nil
}

// runIter runs a socket iterator once in the caller's network namespace
// and returns what it wrote.
func runIter(p *ebpf.Program) ([]byte, error) {
	it, err := link.AttachIter(link.IterOptions{Program: p})
	if err != nil {
		return nil, fmt.Errorf("attach iterator: %w", err)
	}
	defer it.Close()
	r, err := it.Open()
	if err != nil {
		return nil, fmt.Errorf("open iterator: %w", err)
	}
	defer r.Close()
	raw, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("run iterator: %w", err)
	}
	return raw, nil
}

// runDestroyDiag is runDestroy without bpf_sock_destroy (Linux 6.1): the
// iterators write each socket to destroy (struct ez_svc_gone_sock), and
// sock_diag destroys it by address and cookie; the destroyed_* counters
// are counted here.
func (lb *LB) runDestroyDiag() error {
	var errs []error
	for _, p := range []*ebpf.Program{lb.objs.EzSvcGoneTcp, lb.objs.EzSvcGoneUdp} {
		raw, err := runIter(p)
		if err != nil {
			return err
		}
		var g servicesEzSvcGoneSock
		size := binary.Size(g)
		for len(raw) >= size {
			if err := binary.Read(bytes.NewReader(raw[:size]), binary.NativeEndian, &g); err != nil {
				return err
			}
			raw = raw[size:]
			if err := sockDestroy(g); err != nil {
				if !errors.Is(err, unix.ENOENT) { // closed meanwhile
					errs = append(errs, fmt.Errorf("destroy socket %d: %w", g.Cookie, err))
				}
				continue
			}
			c := servicesEzSvcCounterEZ_SVC_C_DESTROYED_TCP
			if g.Proto == unix.IPPROTO_UDP {
				c = servicesEzSvcCounterEZ_SVC_C_DESTROYED_UDP
			}
			errs = append(errs, bpfsys.AddPerCPU(lb.objs.EzSvcCounters, uint32(c), 1))
		}
	}
	return errors.Join(errs...)
}
