package workload

import (
	"errors"
	"math/rand/v2"
	"net"
	"syscall"
	"time"
)

// ConnectResult is what ConnectLatency measured: one connect per sample,
// each to a target chosen at random, the socket closed at once.
type ConnectResult struct {
	Nanos    []int64 `json:"nanos"` // connect() durations of the samples that connected
	Failures int     `json:"failures"`
	LastErr  string  `json:"last_error,omitempty"`
}

// ConnectLatency connects n times, each time a new TCP connection to a
// random one of targets, and times each connect. Connects that fail are
// counted, not timed.
func ConnectLatency(targets []string, n int, timeout time.Duration, seed uint64) (ConnectResult, error) {
	if len(targets) == 0 || n <= 0 {
		return ConnectResult{}, errors.New("connect latency: no targets or no samples")
	}
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	res := ConnectResult{Nanos: make([]int64, 0, n)}
	d := net.Dialer{Timeout: timeout}
	for range n {
		t := targets[r.IntN(len(targets))]
		t0 := time.Now()
		c, err := d.Dial("tcp", t)
		el := time.Since(t0)
		if err != nil {
			res.Failures++
			res.LastErr = err.Error()
			continue
		}
		res.Nanos = append(res.Nanos, el.Nanoseconds())
		c.Close()
	}
	return res, nil
}

// ConnectUntil connects to addr every interval until the outcome is the one
// wanted (connected, or refused when wantRefused) and returns the wall-clock
// time of that connect's end. Other failures (timeouts) keep it trying.
func ConnectUntil(addr string, wantRefused bool, interval, timeout time.Duration) (time.Time, error) {
	deadline := time.Now().Add(timeout)
	d := net.Dialer{Timeout: 200 * time.Millisecond}
	for {
		c, err := d.Dial("tcp", addr)
		now := time.Now()
		if err == nil {
			c.Close()
			if !wantRefused {
				return now, nil
			}
		} else if wantRefused && errors.Is(err, syscall.ECONNREFUSED) {
			return now, nil
		}
		if now.After(deadline) {
			return time.Time{}, errors.New("connect until: outcome not reached before the timeout (last: " + errString(err) + ")")
		}
		time.Sleep(interval)
	}
}

func errString(err error) string {
	if err == nil {
		return "connected"
	}
	return err.Error()
}
