package workload

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// HTTPGetter sends GET requests for one page on one keep-alive connection
// (a RawDial socket), one at a time, and times each until its whole
// response is in: bench mesh-matrix --pairs' client.
type HTTPGetter struct {
	fd   int
	req  []byte
	buf  []byte
	have int // bytes of buf read but not yet consumed
}

// NewHTTPGetter asks for path on fd, the connection to host.
func NewHTTPGetter(fd int, host, path string) *HTTPGetter {
	return &HTTPGetter{fd: fd, req: []byte("GET /" + path + " HTTP/1.1\r\nHost: " + host + "\r\n\r\n"), buf: make([]byte, 64<<10)}
}

// Get sends one request and reads its response (status 200 and a
// Content-Length body, as nginx's static pages through HAProxy are).
func (g *HTTPGetter) Get() (time.Duration, error) {
	start := time.Now()
	if err := writeFull(g.fd, g.req); err != nil {
		return 0, err
	}
	for {
		if end := bytes.Index(g.buf[:g.have], []byte("\r\n\r\n")); end >= 0 {
			total, err := responseLen(g.buf[:end])
			if err != nil {
				return 0, err
			}
			total += end + 4
			if total > len(g.buf) {
				return 0, fmt.Errorf("response of %d bytes, more than %d", total, len(g.buf))
			}
			for g.have < total {
				if err := g.fill(); err != nil {
					return 0, err
				}
			}
			d := time.Since(start)
			g.have = copy(g.buf, g.buf[total:g.have])
			return d, nil
		}
		if err := g.fill(); err != nil {
			return 0, err
		}
	}
}

func (g *HTTPGetter) fill() error {
	if g.have == len(g.buf) {
		return errors.New("response headers larger than the buffer")
	}
	n, err := unix.Read(g.fd, g.buf[g.have:])
	if err == unix.EINTR {
		return nil
	}
	if err == unix.EAGAIN { // the sockmap receive path's spurious EAGAIN: retried and counted, as readFull does
		SpuriousEAGAIN.Add(1)
		return nil
	}
	if err != nil {
		return err
	}
	if n == 0 {
		return io.ErrUnexpectedEOF
	}
	g.have += n
	return nil
}

// responseLen checks a response's head (without the blank line) and
// returns its body's length.
func responseLen(head []byte) (int, error) {
	lines := strings.Split(string(head), "\r\n")
	if f := strings.Fields(lines[0]); len(f) < 2 || f[1] != "200" {
		return 0, fmt.Errorf("response %q", lines[0])
	}
	for _, l := range lines[1:] {
		k, v, ok := strings.Cut(l, ":")
		if ok && strings.EqualFold(strings.TrimSpace(k), "Content-Length") {
			return strconv.Atoi(strings.TrimSpace(v))
		}
	}
	return 0, fmt.Errorf("response without Content-Length: %q", head)
}

// ServeHTTPPhases runs phases as r asks, one a line, answering each with a
// JSON HTTPPhase line on w: "keep ADDR DURATION" runs requests for
// DURATION on the connection to ADDR kept from the last phase (opened if
// there is none, or it was to another address); "fresh ADDR DURATION"
// closes that connection and opens a new one first (connect not timed).
// path is the page asked for. It returns at the end of r.
func ServeHTTPPhases(r io.Reader, w io.Writer, path string) error {
	var g *HTTPGetter
	addr := ""
	defer func() {
		if g != nil {
			unix.Close(g.fd)
		}
	}()
	enc := json.NewEncoder(w)
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 3 || (f[0] != "keep" && f[0] != "fresh") {
			return fmt.Errorf("phase request %q: want keep|fresh ADDR DURATION", sc.Text())
		}
		d, err := time.ParseDuration(f[2])
		if err != nil {
			return err
		}
		if g != nil && (f[0] == "fresh" || f[1] != addr) {
			unix.Close(g.fd)
			g = nil
		}
		if g == nil {
			fd, err := RawDial(f[1])
			if err != nil {
				return err
			}
			g, addr = NewHTTPGetter(fd, f[1], path), f[1]
		}
		ph, err := g.phase(d)
		if err != nil {
			ph.Err = err.Error()
		}
		if err := enc.Encode(ph); err != nil {
			return err
		}
	}
	return sc.Err()
}

// phase runs requests for d.
func (g *HTTPGetter) phase(d time.Duration) (HTTPPhase, error) {
	return timedPhase(d, "response", g.Get)
}
