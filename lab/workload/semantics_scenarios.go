package workload

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// scenarios are the probe scenarios by name. Each observation field is
// deterministic on plain kernel TCP.
var scenarios = map[string]scenario{
	"fionread":        {client: fionreadClient, server: sendPattern(1000, 1)},
	"poll":            {client: pollClient, server: pollServer},
	"epoll_lt":        {client: epollClient(false), server: epollServer},
	"epoll_et":        {client: epollClient(true), server: epollServer},
	"peek":            {client: peekClient, server: sendPattern(100, 2)},
	"waitall":         {client: waitallClient, server: waitallServer},
	"half_close":      {client: halfCloseClient, server: halfCloseServer},
	"close_unread":    {client: closeUnreadClient, server: closeUnreadServer},
	"sendfile":        {client: sendfileClient, server: sinkHash(false)},
	"splice":          {client: spliceClient, server: sinkHash(false)},
	"splice_read":     {client: spliceReadClient, server: sinkHash(true)},
	"nonblock_eagain": {client: nonblockClient, server: nonblockServer},
	"recv_wakeup":     {client: recvWakeupClient, server: recvWakeupServer},
	"stuck_nonblock":  {client: stuckNonblockClient, server: stuckNonblockServer},
	"stuck_blocking":  {client: stuckBlockingClient, server: stuckBlockingServer},
}

func sendPattern(n int, seed uint64) func(*pconn) error {
	return func(c *pconn) error { return c.writeAll(pattern(n, seed)) }
}

// fionread: 1000 bytes arrive; FIONREAD before and after reading 300.
func fionreadClient(c *pconn, o Observation) error {
	c.waitIn()
	o["poll"] = pollNames(c.poll(unix.POLLIN|unix.POLLRDHUP, 0))
	o["fionread_0"] = c.inq()
	b1, err := c.recv(300, 0)
	o["read_300"] = result(len(b1), err)
	o["fionread_1"] = c.inq()
	b2, err := c.recv(1000, 0)
	o["read_rest"] = result(len(b2), err)
	o["fionread_2"] = c.inq()
	o["data_ok"] = bytes.Equal(append(b1, b2...), pattern(1000, 1))
	return nil
}

// poll: revents before data, with data, and after the peer's SHUT_WR.
func pollServer(c *pconn) error {
	if _, err := c.readFull(1); err != nil {
		return err
	}
	if err := c.writeAll(pattern(500, 3)); err != nil {
		return err
	}
	if _, err := c.readFull(1); err != nil {
		return err
	}
	return unix.Shutdown(c.fd, unix.SHUT_WR)
}

func pollClient(c *pconn, o Observation) error {
	const all = unix.POLLIN | unix.POLLOUT | unix.POLLRDHUP
	o["1_before_data"] = pollNames(c.poll(unix.POLLIN|unix.POLLRDHUP, 0))
	if err := c.writeAll([]byte("g")); err != nil {
		return err
	}
	o["2_wait_in"] = pollNames(c.poll(unix.POLLIN, 5000))
	time.Sleep(settle)
	o["3_with_data"] = pollNames(c.poll(all, 0))
	o["3_fionread"] = c.inq()
	if err := c.writeAll([]byte("g")); err != nil {
		return err
	}
	o["4_wait_rdhup"] = pollNames(c.poll(unix.POLLRDHUP, 5000))
	time.Sleep(settle)
	o["5_after_shut"] = pollNames(c.poll(all, 0))
	o["5_fionread"] = c.inq()
	n, err := c.readToEOF(nil)
	o["6_drained"] = result(n, err)
	b, err := c.recv(100, 0)
	o["7_read_at_eof"] = result(len(b), err)
	o["7_after_eof"] = pollNames(c.poll(all, 0))
	return nil
}

// epoll: two 100-byte chunks, the second sent when the client asks; the
// client reads 10 bytes per event and counts the events of each arrival.
func epollServer(c *pconn) error {
	if err := c.writeAll(pattern(100, 4)); err != nil {
		return err
	}
	if _, err := c.readFull(1); err != nil {
		return err
	}
	return c.writeAll(pattern(100, 5))
}

func epollClient(et bool) func(*pconn, Observation) error {
	return func(c *pconn, o Observation) error {
		ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
		if err != nil {
			return err
		}
		defer unix.Close(ep)
		ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLRDHUP, Fd: int32(c.fd)}
		if et {
			ev.Events |= unix.EPOLLET
		}
		if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, c.fd, &ev); err != nil {
			return err
		}
		// phase waits up to 5s for the first event, then counts events
		// until none comes for 200ms, reading 10 bytes per event.
		phase := func(p string) {
			events, read := 0, 0
			masks := map[string]int{}
			evs := make([]unix.EpollEvent, 4)
			for events < 100 {
				timeout := 200
				if events == 0 {
					timeout = 5000
				}
				n, err := unix.EpollWait(ep, evs, timeout)
				if err == unix.EINTR {
					continue
				}
				if err != nil || n == 0 {
					break
				}
				events++
				masks[pollNames(int16(evs[0].Events))]++
				if b, err := c.recv(10, unix.MSG_DONTWAIT); err == nil {
					read += len(b)
				}
			}
			o[p+"_events"] = events
			o[p+"_read"] = read
			o[p+"_masks"] = masks
		}
		phase("chunk1")
		if err := c.writeAll([]byte("n")); err != nil {
			return err
		}
		phase("chunk2")
		o["fionread_left"] = c.inq()
		left := 0
		for {
			b, err := c.recv(1000, unix.MSG_DONTWAIT)
			if err != nil || len(b) == 0 {
				o["drain_end"] = result(len(b), err)
				break
			}
			left += len(b)
		}
		o["drained_left"] = left
		return nil
	}
}

// peek: MSG_PEEK leaves data and FIONREAD as they were.
func peekClient(c *pconn, o Observation) error {
	want := pattern(100, 2)
	c.waitIn()
	o["fionread_0"] = c.inq()
	p1, err := c.recv(10, unix.MSG_PEEK)
	o["peek_10"] = result(len(p1), err)
	o["fionread_1"] = c.inq()
	p2, err := c.recv(10, unix.MSG_PEEK)
	o["peek_10_again"] = result(len(p2), err)
	r, err := c.recv(10, 0)
	o["read_10"] = result(len(r), err)
	o["peek_eq_read"] = bytes.Equal(p1, r) && bytes.Equal(p2, r)
	o["read_ok"] = bytes.Equal(r, want[:10])
	o["fionread_2"] = c.inq()
	p3, err := c.recv(1000, unix.MSG_PEEK)
	o["peek_1000"] = result(len(p3), err)
	o["peek_1000_ok"] = bytes.Equal(p3, want[10:])
	p4, err := c.recv(1000, unix.MSG_PEEK|unix.MSG_DONTWAIT)
	o["peek_dontwait"] = result(len(p4), err)
	rest, err := c.recv(1000, 0)
	o["read_rest"] = result(len(rest), err)
	o["fionread_3"] = c.inq()
	return nil
}

// waitall: 3 x 1000 bytes 20ms apart; MSG_WAITALL returns all 3000.
func waitallServer(c *pconn) error {
	for i := 0; i < 3; i++ {
		if err := c.writeAll(pattern(3000, 6)[i*1000 : (i+1)*1000]); err != nil {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

func waitallClient(c *pconn, o Observation) error {
	b, err := c.recv(3000, unix.MSG_WAITALL)
	o["waitall"] = result(len(b), err)
	rest, err := c.readFull(3000 - len(b))
	o["rest"] = result(len(rest), err)
	o["data_ok"] = bytes.Equal(append(b, rest...), pattern(3000, 6))
	return nil
}

// half_close: the client sends and shuts down writing; the server reads to
// EOF, reports what it got, replies, and closes.
func halfCloseServer(c *pconn) error {
	// Read only once the FIN and whatever followed it are here, so a write
	// after SHUT_WR that got through is always counted.
	c.poll(unix.POLLRDHUP, 5000)
	time.Sleep(settle)
	h := sha256.New()
	n, err := c.readToEOF(func(b []byte) { h.Write(b) })
	if err := c.writeAll(fmt.Appendf(nil, "n=%d err=%v sha=%x\n", n, err != nil, h.Sum(nil))); err != nil {
		return err
	}
	return c.writeAll(pattern(2000, 8))
}

func halfCloseClient(c *pconn, o Observation) error {
	data := pattern(500, 7)
	if err := c.writeAll(data); err != nil {
		return err
	}
	o["shutdown_wr"] = result(0, unix.Shutdown(c.fd, unix.SHUT_WR))
	n, err := c.send(make([]byte, 100), 0)
	o["write_after_shut"] = result(n, err)
	line, err := c.readLine()
	if err != nil {
		o["server_line"] = errName(err)
		return nil
	}
	o["server_line"] = strings.Replace(line, "sha="+sha(data), "sha=ok", 1)
	var reply []byte
	m, err := c.readToEOF(func(b []byte) { reply = append(reply, b...) })
	o["reply"] = result(m, err)
	o["reply_ok"] = bytes.Equal(reply, pattern(2000, 8))
	b, err := c.recv(100, 0)
	o["read_at_eof"] = result(len(b), err)
	return nil
}

// close_unread: the server closes with received data unread. Plain TCP
// answers with a RST: ECONNRESET, then EPIPE.
func closeUnreadServer(c *pconn) error {
	c.poll(unix.POLLIN, 5000)
	time.Sleep(2 * settle)
	c.close()
	return nil
}

func closeUnreadClient(c *pconn, o Observation) error {
	const all = unix.POLLIN | unix.POLLOUT | unix.POLLRDHUP
	if err := c.writeAll(pattern(1000, 9)); err != nil {
		return err
	}
	o["1_wait"] = pollNames(c.poll(unix.POLLIN|unix.POLLRDHUP, 5000))
	time.Sleep(settle)
	o["2_revents"] = pollNames(c.poll(all, 0))
	b, err := c.recv(100, 0)
	o["3_read"] = result(len(b), err)
	n, err := c.send(make([]byte, 1000), 0)
	o["4_write"] = result(n, err)
	time.Sleep(2 * settle)
	o["5_revents"] = pollNames(c.poll(all, 0))
	n, err = c.send(make([]byte, 1000), 0)
	o["6_write"] = result(n, err)
	b, err = c.recv(100, 0)
	o["7_read"] = result(len(b), err)
	return nil
}

// sinkHash reads to EOF (with splice(2) into a pipe when splice is set) and
// replies "n=<bytes> err=<errno or 0> sha=<hex>".
func sinkHash(splice bool) func(*pconn) error {
	return func(c *pconn) error {
		h := sha256.New()
		var n int
		var err error
		if splice {
			n, err = spliceToEOF(c.fd, h.Write)
		} else {
			n, err = c.readToEOF(func(b []byte) { h.Write(b) })
		}
		e := "0"
		if err != nil {
			e = errName(err)
		}
		return c.writeAll(fmt.Appendf(nil, "n=%d err=%s sha=%s\n", n, e, hex.EncodeToString(h.Sum(nil))))
	}
}

// spliceToEOF splices the socket into a pipe until EOF, passing what the
// pipe holds to fn.
func spliceToEOF(fd int, fn func([]byte) (int, error)) (int, error) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return 0, err
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	buf := make([]byte, 64<<10)
	total := 0
	for {
		n, err := unix.Splice(fd, nil, p[1], nil, 64<<10, unix.SPLICE_F_MOVE)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return total, err
		}
		if n == 0 {
			return total, nil
		}
		for left := int(n); left > 0; {
			m, err := unix.Read(p[0], buf[:min(left, len(buf))])
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				return total, err
			}
			fn(buf[:m])
			left -= m
			total += m
		}
	}
}

// serverVerdict shuts down writing, reads the sink's reply line and records
// it with the sha replaced by whether it matched data.
func serverVerdict(c *pconn, o Observation, data []byte) {
	o["shutdown_wr"] = result(0, unix.Shutdown(c.fd, unix.SHUT_WR))
	line, err := c.readLine()
	if err != nil {
		o["server"] = errName(err)
		return
	}
	o["server"] = strings.Replace(line, "sha="+sha(data), "sha=ok", 1)
}

const bulk = 1 << 20

// sendfile: 1 MiB from a file with sendfile(2).
func sendfileClient(c *pconn, o Observation) error {
	data := pattern(bulk, 10)
	f, err := os.CreateTemp("", "ez-probe-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	if _, err := f.Write(data); err != nil {
		return err
	}
	var off int64
	for off < bulk {
		n, err := unix.Sendfile(c.fd, int(f.Fd()), &off, bulk-int(off))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			o["sendfile"] = errName(err)
			break
		}
		if n == 0 {
			break
		}
	}
	o["sent"] = int(off)
	serverVerdict(c, o, data)
	return nil
}

// splice: 1 MiB from a pipe into the socket with splice(2).
func spliceClient(c *pconn, o Observation) error {
	data := pattern(bulk, 11)
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return err
	}
	defer unix.Close(p[0])
	go func() {
		for b := data; len(b) > 0; {
			n, err := unix.Write(p[1], b)
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				break
			}
			b = b[n:]
		}
		unix.Close(p[1])
	}()
	total := 0
	for {
		n, err := unix.Splice(p[0], nil, c.fd, nil, 64<<10, unix.SPLICE_F_MOVE)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			o["splice"] = errName(err)
			break
		}
		if n == 0 {
			break
		}
		total += int(n)
	}
	o["sent"] = total
	serverVerdict(c, o, data)
	return nil
}

// splice_read: the client writes 1 MiB, the server splices it into a pipe.
func spliceReadClient(c *pconn, o Observation) error {
	data := pattern(bulk, 12)
	if err := c.writeAll(data); err != nil {
		o["write"] = errName(err)
	}
	serverVerdict(c, o, data)
	return nil
}

// nonblock_eagain: the server reads nothing until the client, having filled
// the connection, says "drain <id>" on a second connection.
func nonblockServer(c *pconn) error {
	select {
	case <-drainChan(c.id):
	case <-time.After(15 * time.Second):
		return fmt.Errorf("no drain request")
	}
	n, err := c.readToEOF(nil)
	if err != nil {
		return err
	}
	return c.writeAll(fmt.Appendf(nil, "%d\n", n))
}

func nonblockClient(c *pconn, o Observation) error {
	if err := c.setNonblock(true); err != nil {
		return err
	}
	b, err := c.recv(100, 0)
	o["1_recv_empty"] = result(len(b), err)
	// Fill until EAGAIN; the count differs legitimately, only reaching
	// EAGAIN is compared. The cap is far above any TCP buffer.
	sent, until := sendUntilEAGAIN(c, 128<<20, nil)
	o["2_send_until"] = until
	if err := requestDrain(c); err != nil {
		return err
	}
	o["4_pollout"] = pollNames(c.poll(unix.POLLOUT, 10000))
	n, err := c.send(make([]byte, 1000), 0)
	o["5_send"] = result(n, err)
	if err == nil {
		sent += n
	}
	if err := c.setNonblock(false); err != nil {
		return err
	}
	o["6_shutdown_wr"] = result(0, unix.Shutdown(c.fd, unix.SHUT_WR))
	line, err := c.readLine()
	if err != nil {
		o["7_server_got_all"] = errName(err)
		return nil
	}
	o["7_server_got_all"] = line == fmt.Sprint(sent)
	return nil
}

// recv_wakeup: the client blocks in recv with nothing to read, and another
// thread shuts down writing; the ACK of the FIN wakes the socket's wait
// queue. Plain TCP keeps waiting for data: the first recv returns the reply.
func recvWakeupServer(c *pconn) error {
	c.poll(unix.POLLRDHUP, 5000)
	n, err := c.readToEOF(nil)
	if err != nil || n != 0 {
		return fmt.Errorf("read %d bytes before EOF: %v", n, err)
	}
	time.Sleep(2 * settle)
	return c.writeAll([]byte("reply"))
}

func recvWakeupClient(c *pconn, o Observation) error {
	shut := make(chan error, 1)
	go func() {
		time.Sleep(2 * settle)
		shut <- unix.Shutdown(c.fd, unix.SHUT_WR)
	}()
	b, err := c.recv(100, 0)
	o["1_blocking_recv"] = result(len(b), err)
	o["2_shutdown_wr"] = result(0, <-shut)
	rest, err := c.readToEOF(nil)
	o["3_rest_to_eof"] = result(rest, err)
	return nil
}

// stuck_nonblock: the server reads nothing until told; a non-blocking client
// fills the connection until EAGAIN and asks poll and epoll (level and edge
// triggered) whether it is writable, then the server reads everything.
func stuckNonblockServer(c *pconn) error {
	select {
	case <-drainChan(c.id):
	case <-time.After(30 * time.Second):
		return fmt.Errorf("no drain request")
	}
	return checkStream(c)
}

// checkStream reads the checked stream (streamByte) to EOF and answers
// "<bytes> ok" or "<bytes> bad at <offset>".
func checkStream(c *pconn) error {
	off, bad := 0, -1
	if _, err := c.readToEOF(func(b []byte) {
		for i := 0; i < len(b) && bad < 0; i++ {
			if b[i] != streamByte(off+i) {
				bad = off + i
			}
		}
		off += len(b)
	}); err != nil {
		return err
	}
	if bad >= 0 {
		return c.writeAll(fmt.Appendf(nil, "%d bad at %d\n", off, bad))
	}
	return c.writeAll(fmt.Appendf(nil, "%d ok\n", off))
}

// sendUntilEAGAIN sends 64 KiB chunks on the non-blocking c until EAGAIN,
// an error or limit bytes; fill (may be nil) writes the chunk for its stream
// offset. It returns the bytes sent and what stopped it: "EAGAIN", the
// error's name or "limit".
func sendUntilEAGAIN(c *pconn, limit int, fill func(b []byte, off int)) (int, string) {
	chunk := make([]byte, 64<<10)
	sent := 0
	for sent < limit {
		if fill != nil {
			fill(chunk, sent)
		}
		n, err := c.send(chunk, 0)
		if err == unix.EAGAIN {
			return sent, "EAGAIN"
		}
		if err != nil {
			return sent, errName(err)
		}
		sent += n
	}
	return sent, "limit"
}

// sendUntilStuck is sendUntilEAGAIN until EAGAIN holds: after a settle a
// send still gets EAGAIN. On a slow machine (qemu TCG) the receiving
// kernel may still be taking in queued segments when the first EAGAIN
// comes, so plain TCP's send buffer drains and the socket turns writable
// again; the scenario is about a connection stuck for good.
func sendUntilStuck(c *pconn, limit int, fill func(b []byte, off int)) (int, string) {
	sent := 0
	for range 50 {
		n, until := sendUntilEAGAIN(c, limit-sent, func(b []byte, off int) {
			if fill != nil {
				fill(b, sent+off)
			}
		})
		sent += n
		if until != "EAGAIN" {
			return sent, until
		}
		time.Sleep(2 * settle)
		if c.poll(unix.POLLOUT, 0)&unix.POLLOUT == 0 {
			return sent, until
		}
	}
	return sent, "EAGAIN"
}

// requestDrain tells the probe server, on a second connection, to start
// reading connection c.
func requestDrain(c *pconn) error {
	ctl, err := dialProbe(c.addr)
	if err != nil {
		return fmt.Errorf("drain connection: %w", err)
	}
	err = ctl.writeAll(fmt.Appendf(nil, "drain %d\n", c.id))
	ctl.close()
	return err
}

func epollOut(fd int, et bool, timeoutMs int) (int, error) {
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return 0, err
	}
	defer unix.Close(ep)
	ev := unix.EpollEvent{Events: unix.EPOLLOUT, Fd: int32(fd)}
	if et {
		ev.Events |= unix.EPOLLET
	}
	if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		return 0, err
	}
	evs := make([]unix.EpollEvent, 1)
	for {
		n, err := unix.EpollWait(ep, evs, timeoutMs)
		if err == unix.EINTR {
			continue
		}
		return n, err
	}
}

func stuckNonblockClient(c *pconn, o Observation) error {
	if err := c.setNonblock(true); err != nil {
		return err
	}
	// The count differs legitimately (the shortcut's bound plus the
	// kernel's buffers); reaching EAGAIN, and what poll says then, is compared.
	sent, until := sendUntilStuck(c, 256<<20, fillStream)
	o["1_send_until"] = until
	o["2_poll"] = pollNames(c.poll(unix.POLLOUT, 0))
	n, err := epollOut(c.fd, false, 0)
	o["3_epoll_lt"] = result(n, err)
	n, err = epollOut(c.fd, true, 0)
	o["3_epoll_et"] = result(n, err)
	if err := requestDrain(c); err != nil {
		return err
	}
	o["4_pollout"] = pollNames(c.poll(unix.POLLOUT, 10000))
	n, err = epollOut(c.fd, true, 10000)
	o["5_epoll_et"] = result(n, err)
	if err := c.setNonblock(false); err != nil {
		return err
	}
	o["6_shutdown_wr"] = result(0, unix.Shutdown(c.fd, unix.SHUT_WR))
	line, err := c.readLine()
	if err != nil {
		o["7_server"] = errName(err)
		return nil
	}
	o["7_server_got_all"] = line == fmt.Sprintf("%d ok", sent)
	return nil
}

// stuck_blocking: a blocking client writes 16 MiB to a server that reads
// nothing until told: the write must still be blocked after a while (on the
// shortcut too: the connection switched to the kernel path). Then the server
// reads it all, checks it, and reports FIONREAD for 1000 more bytes, which
// is exact only off the sockhash.
const stuckBlockingBytes = 16 << 20

func stuckBlockingServer(c *pconn) error {
	select {
	case <-drainChan(c.id):
	case <-time.After(30 * time.Second):
		return fmt.Errorf("no drain request")
	}
	off, bad := 0, -1
	for off < stuckBlockingBytes {
		b, err := c.loopRecv(min(64<<10, stuckBlockingBytes-off))
		if err != nil {
			return err
		}
		if len(b) == 0 {
			break
		}
		for i := 0; i < len(b) && bad < 0; i++ {
			if b[i] != streamByte(off+i) {
				bad = off + i
			}
		}
		off += len(b)
	}
	if err := c.writeAll(fmt.Appendf(nil, "%d bad=%d\n", off, bad)); err != nil {
		return err
	}
	c.poll(unix.POLLIN, 5000)
	time.Sleep(settle)
	return c.writeAll(fmt.Appendf(nil, "%v\n", c.inq()))
}

func stuckBlockingClient(c *pconn, o Observation) error {
	done := make(chan error, 1)
	go func() {
		buf := make([]byte, 1<<20)
		for off := 0; off < stuckBlockingBytes; off += len(buf) {
			fillStream(buf, off)
			if err := c.writeAll(buf); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	select {
	case err := <-done:
		o["1_blocked"] = false
		o["1_early"] = result(0, err)
	case <-time.After(3 * time.Second):
		o["1_blocked"] = true
	}
	if err := requestDrain(c); err != nil {
		return err
	}
	if o["1_blocked"] == true {
		o["2_write"] = result(stuckBlockingBytes, <-done)
	}
	line, err := c.readLine()
	o["3_server"] = result(0, err)
	if err == nil {
		o["3_server"] = line
	}
	if err := c.writeAll(pattern(1000, 9)); err != nil {
		return err
	}
	line, err = c.readLine()
	o["4_fionread"] = result(0, err)
	if err == nil {
		o["4_fionread"] = line
	}
	return nil
}
