package netlab

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// AddLoopbackPod adds a pod with only its loopback device (IPv4 127.0.0.1),
// in the lab's unmanaged cgroup subtree, whose network namespace owns a TCP
// established hash of ehashEntries buckets (a power of two from 128: the
// kernel's net.ipv4.tcp_child_ehash_entries) instead of sharing the
// host's: its connections' lookups do not depend on how many sockets the
// rest of the machine holds. bench scale measures the host's drift with it.
// Close and Sweep remove it as any pod.
func (l *Lab) AddLoopbackPod(name string, ehashEntries int) (_ *Pod, err error) {
	if len(name) > 5 {
		return nil, fmt.Errorf("netlab: pod name %q longer than 5 characters", name)
	}
	if ehashEntries < 128 || ehashEntries&(ehashEntries-1) != 0 {
		return nil, fmt.Errorf("netlab: %d established-hash buckets: want a power of two from 128", ehashEntries)
	}
	p := &Pod{Name: name, NetNS: fmt.Sprintf("%s-%s-%s", Prefix, l.Name, name), IPv4: netip.MustParseAddr("127.0.0.1"),
		IPv6: netip.IPv6Loopback(), lab: l}
	p.Cgroup = filepath.Join(l.Unmanaged, name)
	if err := os.Mkdir(p.Cgroup, 0o755); err != nil {
		return nil, fmt.Errorf("netlab: cgroup %s: %w", p.Cgroup, err)
	}
	l.mu.Lock()
	l.pods = append(l.pods, p)
	l.mu.Unlock()
	if err := createLoopback(p.NetNS, ehashEntries); err != nil {
		return nil, err
	}
	got, err := p.ehashEntries()
	if err != nil {
		return nil, err
	}
	if got != ehashEntries {
		return nil, fmt.Errorf("netlab: %s has %d established-hash buckets, want its own %d (negative: the host's)", p.NetNS, got, ehashEntries)
	}
	return p, nil
}

// createLoopback makes the named namespace as the child of an unnamed one
// whose tcp_child_ehash_entries is set: the sysctl is read from the parent
// at unshare, and setting it in a namespace of our own leaves the host's
// alone (other namespaces created meanwhile still share the host's hash).
func createLoopback(name string, ehashEntries int) error {
	runtime.LockOSThread()
	host, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer host.Close()
	restored := false
	defer func() {
		// A thread left in another namespace must not run other
		// goroutines: it stays locked and exits with this one.
		if restored {
			runtime.UnlockOSThread()
		}
	}()
	parent, err := netns.New() // switches this thread into it
	if err != nil {
		restored = netns.Set(host) == nil
		return fmt.Errorf("netlab: namespace for %s's parent: %w", name, err)
	}
	defer parent.Close()
	// /proc/sys/net is the opening thread's namespace: parent's.
	werr := os.WriteFile("/proc/sys/net/ipv4/tcp_child_ehash_entries", []byte(strconv.Itoa(ehashEntries)), 0o644)
	var ns netns.NsHandle
	if werr == nil {
		ns, err = netns.NewNamed(name)
	}
	restored = netns.Set(host) == nil
	switch {
	case werr != nil:
		return fmt.Errorf("netlab: net.ipv4.tcp_child_ehash_entries in %s's parent: %w", name, werr)
	case err != nil:
		return fmt.Errorf("netlab: netns %s: %w", name, err)
	case !restored:
		ns.Close()
		return errors.New("netlab: could not return to the host's namespace")
	}
	defer ns.Close()
	h, err := loopbackUp(ns)
	if err != nil {
		return err
	}
	h.Close()
	return nil
}

// loopbackUp sets ns's loopback up and returns a handle in ns.
func loopbackUp(ns netns.NsHandle) (*netlink.Handle, error) {
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, err
	}
	lo, err := h.LinkByName("lo")
	if err == nil {
		err = h.LinkSetUp(lo)
	}
	if err != nil {
		h.Close()
		return nil, err
	}
	return h, nil
}

// ehashEntries is net.ipv4.tcp_ehash_entries in the pod: its established
// hash's buckets, negative when it shares the host's.
func (p *Pod) ehashEntries() (int, error) {
	var n int
	err := p.Do(func() error {
		b, err := os.ReadFile("/proc/sys/net/ipv4/tcp_ehash_entries")
		if err != nil {
			return err
		}
		n, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err
	})
	return n, err
}
