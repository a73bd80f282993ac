package workload

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// echoWarmup round trips per connection are not timed: the first ones of a
// fresh connection pay for its proxies' and servers' first reads.
const echoWarmup = 2

// ServeEchoPhases runs phases of back-to-back ping-echo as r asks, one a
// line, answering each with a JSON EchoPhase line on w: "ADDR DURATION
// CONNS SIZE" opens CONNS fresh connections to the echo server at ADDR
// (connect and echoWarmup round trips each not timed), sends SIZE-byte
// messages on them in turn, each after the previous echo came back, for
// DURATION, and closes them. It returns at the end of r.
func ServeEchoPhases(r io.Reader, w io.Writer) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	enc := json.NewEncoder(w)
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 4 {
			return fmt.Errorf("phase request %q: want ADDR DURATION CONNS SIZE", sc.Text())
		}
		d, err := time.ParseDuration(f[1])
		if err != nil {
			return err
		}
		conns, err := strconv.Atoi(f[2])
		if err != nil || conns < 1 {
			return fmt.Errorf("phase request %q: connections %q", sc.Text(), f[2])
		}
		size, err := strconv.Atoi(f[3])
		if err != nil {
			return fmt.Errorf("phase request %q: size %q", sc.Text(), f[3])
		}
		ph, err := echoPhase(f[0], d, conns, size)
		if err != nil {
			ph.Err = err.Error()
		}
		if err := enc.Encode(ph); err != nil {
			return err
		}
	}
	return sc.Err()
}

// echoPhase is one phase on conns fresh connections to addr.
func echoPhase(addr string, d time.Duration, conns, size int) (EchoPhase, error) {
	var pps []*PingPonger
	defer func() {
		for _, p := range pps {
			unix.Close(p.fd)
		}
	}()
	for range conns {
		fd, err := RawDial(addr)
		if err != nil {
			return EchoPhase{}, err
		}
		p, err := NewPingPonger(fd, size)
		if err != nil {
			unix.Close(fd)
			return EchoPhase{}, err
		}
		pps = append(pps, p)
		for range echoWarmup {
			if _, err := p.RoundTrip(); err != nil {
				return EchoPhase{}, err
			}
		}
	}
	n := 0
	return timedPhase(d, "round trip", func() (time.Duration, error) {
		n++
		return pps[(n-1)%len(pps)].RoundTrip()
	})
}
