package workload

import (
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"strings"
	"time"
)

// The peer servers say who answered: over TCP, after the client's half
// close, "<name>|<client address as the server sees it>|<sha256 of what it
// read>"; over UDP, each datagram comes back as "<name>|<client address>|<
// datagram>". name is the server's (a pod's name): through a Service, which
// backend was chosen and what source it saw.

// ServePeer answers every connection on ln until ln fails.
func ServePeer(ln net.Listener, name string) error {
	return acceptEach(ln, func(c net.Conn) {
		c.SetDeadline(time.Now().Add(time.Minute))
		h := sha256.New()
		if _, err := io.Copy(h, c); err == nil {
			fmt.Fprintf(c, "%s|%s|%x", name, c.RemoteAddr(), h.Sum(nil))
		}
	})
}

// ServePeerUDP answers every datagram on pc until pc fails.
func ServePeerUDP(pc net.PacketConn, name string) error {
	buf := make([]byte, 65536)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			return err
		}
		pc.WriteTo(fmt.Appendf(nil, "%s|%s|%s", name, from, buf[:n]), from)
	}
}

// PeerAnswer is one connection's (or datagram's) answer: the server's name
// and the client address it saw; Err when there was none, or it was not
// exact (the stream's hash or the datagram differed).
type PeerAnswer struct {
	Backend string `json:"backend,omitempty"`
	Seen    string `json:"seen,omitempty"`
	Err     string `json:"err,omitempty"`
}

// PeerTCP makes conns connections to addr one after the other, each
// sending size random bytes, and returns each one's answer.
func PeerTCP(addr string, conns, size int, timeout time.Duration) []PeerAnswer {
	out := make([]PeerAnswer, 0, conns)
	for range conns {
		out = append(out, peerTCP(addr, size, timeout))
	}
	return out
}

func peerTCP(addr string, size int, timeout time.Duration) PeerAnswer {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return PeerAnswer{Err: err.Error()}
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	data := make([]byte, size)
	rand.Read(data)
	if _, err := c.Write(data); err != nil {
		return PeerAnswer{Err: err.Error()}
	}
	c.(*net.TCPConn).CloseWrite()
	got, err := io.ReadAll(c)
	if err != nil {
		return PeerAnswer{Err: err.Error()}
	}
	parts := strings.SplitN(string(got), "|", 3)
	if len(parts) != 3 {
		return PeerAnswer{Err: fmt.Sprintf("answer %q", got)}
	}
	a := PeerAnswer{Backend: parts[0], Seen: parts[1]}
	if want := fmt.Sprintf("%x", sha256.Sum256(data)); parts[2] != want {
		a.Err = fmt.Sprintf("%d bytes arrived with sha256 %s, sent %s", size, parts[2], want)
	}
	return a
}

// PeerUDP sends n numbered datagrams of at least size bytes to addr on one
// connected socket, each after the previous one's answer (or timeout), and
// returns each one's answer.
func PeerUDP(addr string, n, size int, timeout time.Duration) []PeerAnswer {
	out := make([]PeerAnswer, 0, n)
	c, err := net.Dial("udp", addr)
	if err != nil {
		return append(out, PeerAnswer{Err: err.Error()})
	}
	defer c.Close()
	buf := make([]byte, 65536)
	for i := range n {
		msg := fmt.Sprintf("%08d|", i)
		msg += strings.Repeat("x", max(size-len(msg), 0))
		c.SetDeadline(time.Now().Add(timeout))
		if _, err := c.Write([]byte(msg)); err != nil {
			out = append(out, PeerAnswer{Err: err.Error()})
			continue
		}
		k, err := c.Read(buf)
		if err != nil {
			out = append(out, PeerAnswer{Err: err.Error()})
			continue
		}
		parts := strings.SplitN(string(buf[:k]), "|", 3)
		if len(parts) != 3 {
			out = append(out, PeerAnswer{Err: fmt.Sprintf("answer %q", buf[:k])})
			continue
		}
		a := PeerAnswer{Backend: parts[0], Seen: parts[1]}
		if parts[2] != msg {
			a.Err = fmt.Sprintf("datagram %d came back as %q", i, parts[2])
		}
		out = append(out, a)
	}
	return out
}
