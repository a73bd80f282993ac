package bpfsys

import (
	"errors"
	"fmt"
	"path/filepath"
	"runtime"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// InNetNS runs fn on a thread moved into the named netns ("" runs it where
// the process is). Netfilter links and tcx attach in the caller's netns.
func InNetNS(name string, fn func() error) (err error) {
	if name == "" {
		return fn()
	}
	return inNetNS(name, func() (netns.NsHandle, error) { return netns.GetFromName(name) }, fn)
}

// InNetNSPath is InNetNS for a namespace named by an nsfs file
// (/proc/PID/ns/net, a bind mount under /run/netns).
func InNetNSPath(path string, fn func() error) error {
	return inNetNS(path, func() (netns.NsHandle, error) { return netns.GetFromPath(path) }, fn)
}

// InNetNSHandle is InNetNS for a namespace held by a handle (left open).
func InNetNSHandle(h netns.NsHandle, fn func() error) error {
	return inNetNS(h.String(), func() (netns.NsHandle, error) {
		fd, err := unix.Dup(int(h))
		return netns.NsHandle(fd), err
	}, fn)
}

// NewNetNS makes an unnamed network namespace and returns its handle; it
// lives until the last handle and the last thing in it go. The thread
// that makes it goes straight back to its own namespace.
func NewNetNS() (netns.NsHandle, error) {
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return netns.None(), err
	}
	defer orig.Close()
	ns, err := netns.New() // moves this thread into it
	if err != nil {
		runtime.UnlockOSThread()
		return netns.None(), fmt.Errorf("new netns: %w", err)
	}
	if err := netns.Set(orig); err != nil {
		// The thread stays locked: the runtime discards it when this
		// goroutine ends, so no other goroutine runs in that netns.
		ns.Close()
		return netns.None(), fmt.Errorf("return from a new netns: %w", err)
	}
	runtime.UnlockOSThread()
	return ns, nil
}

func inNetNS(name string, get func() (netns.NsHandle, error), fn func() error) (err error) {
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer orig.Close()
	target, err := get()
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("netns %s: %w", name, err)
	}
	defer target.Close()
	if err := netns.Set(target); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("enter netns %s: %w", name, err)
	}
	defer func() {
		if serr := netns.Set(orig); serr != nil {
			// The thread stays locked: the runtime discards it when this
			// goroutine ends, so no other goroutine runs in that netns.
			err = errors.Join(err, fmt.Errorf("return from netns %s: %w", name, serr))
			return
		}
		runtime.UnlockOSThread()
	}()
	return fn()
}

// NetNSCookie is the kernel's cookie of the named netns (SO_NETNS_COOKIE);
// "" is the calling thread's.
func NetNSCookie(name string) (cookie uint64, err error) {
	err = InNetNS(name, func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		cookie, err = unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("netns cookie of %q: %w", name, err)
	}
	return cookie, nil
}

// NetNamespaces lists one nsfs path for every network namespace a task on
// the node is in (/proc/PID/task/TID/ns/net) or that is bound under
// /run/netns, deduplicated by inode. A namespace that holds sockets but no
// task and no bind mount is not found (a socket created by a task that left it).
func NetNamespaces() ([]string, error) {
	seen := map[uint64]bool{}
	var out []string
	add := func(p string) {
		var st unix.Stat_t
		if unix.Stat(p, &st) != nil || seen[st.Ino] {
			return
		}
		seen[st.Ino] = true
		out = append(out, p)
	}
	add("/proc/self/ns/net")
	tasks, err := filepath.Glob("/proc/[0-9]*/task/[0-9]*/ns/net")
	if err != nil {
		return nil, err
	}
	for _, p := range tasks {
		add(p)
	}
	bound, _ := filepath.Glob("/run/netns/*")
	for _, p := range bound {
		add(p)
	}
	return out, nil
}
