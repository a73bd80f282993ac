package tracer

import (
	"fmt"
	"runtime"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// inNetNS runs fn on a thread moved into the named netns ("" runs it where
// the process is). Netfilter links and tcx attach in the caller's netns.
func inNetNS(name string, fn func() error) error {
	if name == "" {
		return fn()
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		return err
	}
	defer orig.Close()
	target, err := netns.GetFromName(name)
	if err != nil {
		return fmt.Errorf("netns %s: %w", name, err)
	}
	defer target.Close()
	if err := netns.Set(target); err != nil {
		return fmt.Errorf("enter netns %s: %w", name, err)
	}
	// Back before the thread is unlocked, or it must die.
	defer func() {
		if err := netns.Set(orig); err != nil {
			panic(fmt.Sprintf("tracer: cannot return to the original netns: %v", err))
		}
	}()
	return fn()
}

// netnsCookie is the kernel's cookie of the named netns (SO_NETNS_COOKIE).
func netnsCookie(name string) (cookie uint64, err error) {
	err = inNetNS(name, func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		var v uint64
		v, err = getsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
		cookie = v
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("netns cookie of %q: %w", name, err)
	}
	return cookie, nil
}
