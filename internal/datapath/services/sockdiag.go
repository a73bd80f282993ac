package services

import (
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"
)

// sockDestroy asks sock_diag to destroy one socket of the calling thread's
// network namespace (SOCK_DESTROY, net/core/sock_diag.c; the kernel needs
// CONFIG_INET_DIAG_DESTROY and the caller CAP_NET_ADMIN): the socket with
// that local and remote address and that cookie, so never another one that
// took the addresses meanwhile. TCP sockets are aborted (ECONNABORTED to
// the application, RST to the peer), UDP ones get ECONNABORTED, as with
// bpf_sock_destroy. vishvananda/netlink's SocketDestroy is IPv4 TCP only.
func sockDestroy(g servicesEzSvcGoneSock) error {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		return fmt.Errorf("sock_diag socket: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("sock_diag bind: %w", err)
	}
	const hdr, req = unix.NLMSG_HDRLEN, 56 // struct inet_diag_req_v2
	b := make([]byte, hdr+req)
	ne := binary.NativeEndian
	ne.PutUint32(b[0:], uint32(len(b)))
	ne.PutUint16(b[4:], unix.SOCK_DESTROY)
	ne.PutUint16(b[6:], unix.NLM_F_REQUEST|unix.NLM_F_ACK)
	ne.PutUint32(b[8:], 1)
	r := b[hdr:]
	family := byte(unix.AF_INET6)
	if g.Family == 4 {
		family = unix.AF_INET
	}
	r[0], r[1] = family, g.Proto
	ne.PutUint32(r[4:], 0xffffffff) // every state
	id := r[8:]                     // struct inet_diag_sockid
	binary.BigEndian.PutUint16(id[0:], g.Sport)
	binary.BigEndian.PutUint16(id[2:], g.Dport)
	if g.Family == 4 {
		copy(id[4:8], g.Src[12:])
		copy(id[20:24], g.Dst[12:])
	} else {
		copy(id[4:20], g.Src[:])
		copy(id[20:36], g.Dst[:])
	}
	ne.PutUint32(id[40:], uint32(g.Cookie))
	ne.PutUint32(id[44:], uint32(g.Cookie>>32))
	if err := unix.Sendto(fd, b, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("sock_diag send: %w", err)
	}
	buf := make([]byte, 4096)
	n, _, err := unix.Recvfrom(fd, buf, 0)
	if err != nil {
		return fmt.Errorf("sock_diag receive: %w", err)
	}
	msgs, err := syscall.ParseNetlinkMessage(buf[:n])
	if err != nil {
		return fmt.Errorf("sock_diag reply: %w", err)
	}
	for _, m := range msgs {
		if m.Header.Type != unix.NLMSG_ERROR || len(m.Data) < 4 {
			continue
		}
		if code := int32(ne.Uint32(m.Data)); code != 0 {
			return unix.Errno(-code)
		}
		return nil
	}
	return errors.New("sock_diag: no acknowledgement")
}
