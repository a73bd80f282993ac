// Package netprobe times single network operations for benchmarks: a TCP
// connect, and the round trips of a UDP flow to an echo. Raw syscalls on
// the calling thread, so the time is the kernel's and the peer's, not the
// Go runtime's poller.
package netprobe

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// sockaddr is to as a socket family and address.
func sockaddr(to netip.AddrPort) (int, unix.Sockaddr) {
	if to.Addr().Is4() {
		return unix.AF_INET, &unix.SockaddrInet4{Port: int(to.Port()), Addr: to.Addr().As4()}
	}
	return unix.AF_INET6, &unix.SockaddrInet6{Port: int(to.Port()), Addr: to.Addr().As16()}
}

// sysAddrPort is sa as an address and port (zero if neither family). The
// probes receive with syscall.Recvfrom: unix.Recvfrom asks the socket for
// its protocol (getsockopt SO_PROTOCOL) after every IPv4 datagram, one
// more syscall, and one more run of any cgroup/getsockopt program, per
// datagram measured.
func sysAddrPort(sa syscall.Sockaddr) netip.AddrPort {
	switch a := sa.(type) {
	case *syscall.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port))
	case *syscall.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(a.Addr), uint16(a.Port))
	}
	return netip.AddrPort{}
}

// Connect times a blocking connect() to to (the syscall only), then closes
// with RST (no TIME_WAIT on the client).
func Connect(to netip.AddrPort) (time.Duration, error) {
	fam, sa := sockaddr(to)
	fd, err := unix.Socket(fam, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	start := time.Now()
	err = unix.Connect(fd, sa)
	d := time.Since(start)
	if err != nil {
		return 0, err
	}
	unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0})
	return d, nil
}

// UDPFlow sends count datagrams from a new unconnected socket, bound to
// local port from (0: an ephemeral one), to to, each after the echo of the
// one before, and returns each round trip (sendto to the end of recvfrom).
// A reply must come from to (what the application sees, after any
// translation is reversed) with the payload sent; none for 2 s is an
// error.
func UDPFlow(from uint16, to netip.AddrPort, count int) ([]time.Duration, error) {
	fam, sa := sockaddr(to)
	fd, err := unix.Socket(fam, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	if from != 0 {
		local := unix.Sockaddr(&unix.SockaddrInet4{Port: int(from)})
		if fam == unix.AF_INET6 {
			local = &unix.SockaddrInet6{Port: int(from)}
		}
		if err := unix.Bind(fd, local); err != nil {
			return nil, fmt.Errorf("bind port %d: %w", from, err)
		}
	}
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 2}); err != nil {
		return nil, err
	}
	msg, buf := make([]byte, 64), make([]byte, 128)
	out := make([]time.Duration, 0, count)
	for i := range count {
		msg[0], msg[1] = byte(i), byte(i>>8)
		start := time.Now()
		if err := unix.Sendto(fd, msg, 0, sa); err != nil {
			return nil, fmt.Errorf("send to %s: %w", to, err)
		}
		n, from, err := syscall.Recvfrom(fd, buf, 0)
		for err == syscall.EINTR { // a signal to the runtime (preemption): a socket with SO_RCVTIMEO is not restarted
			n, from, err = syscall.Recvfrom(fd, buf, 0)
		}
		d := time.Since(start)
		if err != nil {
			return nil, fmt.Errorf("datagram %d to %s: %w", i, to, err)
		}
		if got := sysAddrPort(from); got != to {
			return nil, fmt.Errorf("datagram %d to %s: reply from %s", i, to, got)
		}
		if !bytes.Equal(buf[:n], msg) {
			return nil, fmt.Errorf("datagram %d to %s: reply %x, sent %x", i, to, buf[:n], msg)
		}
		out = append(out, d)
	}
	return out, nil
}

// Echo answers every UDP datagram on fd with the same bytes, to its
// sender, until fd is closed or shut down. It runs on a thread of its own
// (locked, blocking recvfrom), so a datagram wakes it directly rather than
// through the Go runtime's poller, whose wake-up time varies by tens of µs
// with what the runtime's other threads are doing.
// With cpu >= 0 the thread is pinned to that CPU.
func Echo(fd, cpu int) {
	// Unlocked at the end with its affinity restored, so the thread lives
	// on: a discarded thread would SIGKILL the children forked from it with
	// Pdeathsig (the lab's servers; golang/go#27505).
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if cpu >= 0 {
		if restore, err := PinThread(cpu); err == nil { // best effort
			defer restore()
		}
	}
	buf := make([]byte, 65536)
	for {
		n, from, err := syscall.Recvfrom(fd, buf, 0)
		if err == syscall.EINTR {
			continue
		}
		if err != nil || n == 0 && from == nil {
			return
		}
		syscall.Sendto(fd, buf[:n], 0, from)
	}
}

// PinThread pins the calling OS thread to cpu and returns what restores
// its affinity; the caller must hold the thread (runtime.LockOSThread).
func PinThread(cpu int) (restore func(), err error) {
	var old, set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &old); err != nil {
		return nil, err
	}
	set.Set(cpu)
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		return nil, fmt.Errorf("pin to CPU %d: %w", cpu, err)
	}
	return func() { unix.SchedSetaffinity(0, &old) }, nil
}

// ListenUDP is a UDP socket bound to addr (port 0: any), for Echo, and
// the address it is bound to. Close it with unix.Shutdown, which wakes a
// blocked recvfrom, then unix.Close.
func ListenUDP(addr netip.AddrPort) (int, netip.AddrPort, error) {
	fam, sa := sockaddr(addr)
	fd, err := unix.Socket(fam, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, netip.AddrPort{}, err
	}
	if err := unix.Bind(fd, sa); err != nil {
		unix.Close(fd)
		return -1, netip.AddrPort{}, fmt.Errorf("bind %s: %w", addr, err)
	}
	got, err := syscall.Getsockname(fd)
	if err != nil {
		unix.Close(fd)
		return -1, netip.AddrPort{}, err
	}
	return fd, sysAddrPort(got), nil
}

// AcceptAndClose accepts connections on ln and closes each at once, until
// ln is closed: a peer for Connect.
func AcceptAndClose(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		c.Close()
	}
}
