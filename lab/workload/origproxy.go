package workload

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"

	"golang.org/x/sys/unix"
)

// OrigProxyConn is what an original-destination proxy saw of one
// connection: the SO_ORIGINAL_DST answer (IPv4) and the peer of the
// connection it made there.
type OrigProxyConn struct {
	Orig     string `json:"orig"`
	Upstream string `json:"upstream_peer,omitempty"`
	Error    string `json:"error,omitempty"`
}

// originalDst asks SO_ORIGINAL_DST (IPv4) of an accepted connection.
func originalDst(c *net.TCPConn) (netip.AddrPort, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var sa [16]byte
	var gerr error
	err = rc.Control(func(fd uintptr) {
		// A struct sockaddr_in fits in IPv6Mreq's first 16 bytes: x/sys
		// has no getsockopt for raw bytes.
		var m *unix.IPv6Mreq
		if m, gerr = unix.GetsockoptIPv6Mreq(int(fd), unix.SOL_IP, unix.SO_ORIGINAL_DST); gerr == nil {
			sa = m.Multiaddr
		}
	})
	if err == nil {
		err = gerr
	}
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("SO_ORIGINAL_DST: %w", err)
	}
	// struct sockaddr_in: family, port (network order), address.
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte(sa[4:8])), binary.BigEndian.Uint16(sa[2:4])), nil
}

// OrigProxy is a sidecar behind an iptables REDIRECT (as Istio's and
// Linkerd's): it accepts on ln, asks each connection's original
// destination, connects there and splices the bytes both ways, and writes
// a JSON line per connection (OrigProxyConn) to report. Runs until ln is
// closed.
func OrigProxy(ln net.Listener, report io.Writer) error {
	var mu sync.Mutex
	enc := json.NewEncoder(report)
	return acceptEach(ln, func(c net.Conn) {
		var rep OrigProxyConn
		defer func() {
			mu.Lock()
			enc.Encode(rep)
			mu.Unlock()
		}()
		dst, err := originalDst(c.(*net.TCPConn))
		if err != nil {
			rep.Error = err.Error()
			return
		}
		rep.Orig = dst.String()
		u, err := net.Dial("tcp", dst.String())
		if err != nil {
			rep.Error = err.Error()
			return
		}
		defer u.Close()
		rep.Upstream = u.RemoteAddr().String()
		// read/write copies, not io.Copy's splice(2) between TCP
		// connections: with the socket shortcut, bytes redirected to a
		// socket are not seen by splice (docs/families/shortcut-design.md, "What
		// still differs from plain TCP"), as a mesh proxy's are read.
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			io.Copy(struct{ io.Writer }{c}, struct{ io.Reader }{u})
			c.(*net.TCPConn).CloseWrite()
		}()
		io.Copy(struct{ io.Writer }{u}, struct{ io.Reader }{c})
		u.(*net.TCPConn).CloseWrite()
		wg.Wait()
	})
}
