package netlab

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Handle is a netlink handle in the pod's network namespace; Close it.
func (p *Pod) Handle() (*netlink.Handle, error) {
	return NetnsHandle(p.NetNS)
}

// NetnsHandle is a netlink handle in the named network namespace.
func NetnsHandle(name string) (*netlink.Handle, error) {
	ns, err := netns.GetFromName(name)
	if err != nil {
		return nil, fmt.Errorf("netlab: netns %s: %w", name, err)
	}
	defer ns.Close()
	// sock_diag is not among netlink's default families: without it the
	// handle would ask the caller's namespace.
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE, unix.NETLINK_NETFILTER, unix.NETLINK_INET_DIAG)
	if err != nil {
		return nil, fmt.Errorf("netlab: netlink in %s: %w", name, err)
	}
	return h, nil
}

// NotListening returns the ports of ports with no TCP listener (IPv4 or
// IPv6) in the pod's netns, asked with sock_diag.
func (p *Pod) NotListening(ports []int) ([]int, error) {
	h, err := p.Handle()
	if err != nil {
		return ports, err
	}
	defer h.Close()
	have := map[int]bool{}
	for _, fam := range []uint8{unix.AF_INET, unix.AF_INET6} {
		socks, err := h.SocketDiagTCP(fam)
		if err != nil {
			return ports, fmt.Errorf("netlab: sock_diag in %s: %w", p.NetNS, err)
		}
		for _, s := range socks {
			if s.State == netlink.TCP_LISTEN {
				have[int(s.ID.SourcePort)] = true
			}
		}
	}
	var missing []int
	for _, port := range ports {
		if !have[port] {
			missing = append(missing, port)
		}
	}
	return missing, nil
}

// Sysctl sets a net.* sysctl (key as in sysctl(8), e.g.
// net.ipv4.conf.all.accept_redirects) in the pod's netns. The namespace
// goes away with the pod, so nothing needs restoring.
func (p *Pod) Sysctl(key, value string) error {
	if !strings.HasPrefix(key, "net.") {
		return fmt.Errorf("netlab: sysctl %s is not per network namespace", key)
	}
	path := filepath.Join("/proc/sys", strings.ReplaceAll(key, ".", "/"))
	return p.Do(func() error { return os.WriteFile(path, []byte(value), 0o644) })
}

// Do runs fn on a thread inside the pod's network namespace. The thread
// is never reused if it cannot return to the host namespace.
func (p *Pod) Do(fn func() error) error { return InNetns(p.NetNS, fn) }

// InNetns runs fn on a thread inside the named network namespace. Sockets
// fn opens stay in that namespace. The thread is never reused if it cannot
// return to the host namespace.
func InNetns(name string, fn func() error) error {
	res := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // unlocked once back in the host namespace; else the thread exits with the goroutine
		host, err := netns.Get()
		if err != nil {
			res <- err
			return
		}
		defer host.Close()
		ns, err := netns.GetFromName(name)
		if err != nil {
			res <- fmt.Errorf("netlab: netns %s: %w", name, err)
			return
		}
		defer ns.Close()
		if err := netns.Set(ns); err != nil {
			res <- err
			return
		}
		// /proc/sys/net resolves against the opening thread's netns.
		err = fn()
		if err2 := netns.Set(host); err2 == nil {
			runtime.UnlockOSThread()
		}
		res <- err
	}()
	return <-res
}
