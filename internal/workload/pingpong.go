package workload

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

// ServeEcho answers ping-pong clients: a 4-byte message size, then each
// message of that size is echoed back whole.
func ServeEcho(ln net.Listener) error {
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		go func() {
			defer c.Close()
			var hb [4]byte
			if _, err := io.ReadFull(c, hb[:]); err != nil {
				return
			}
			buf := make([]byte, binary.LittleEndian.Uint32(hb[:]))
			for {
				if _, err := io.ReadFull(c, buf); err != nil {
					return
				}
				if _, err := c.Write(buf); err != nil {
					return
				}
			}
		}()
	}
}

// PingPong sends n messages of size bytes (after warmup unrecorded ones),
// each after the previous echo returned, and returns the round-trip times.
func PingPong(c net.Conn, size, n, warmup int) ([]time.Duration, error) {
	if size < 8 {
		return nil, fmt.Errorf("message size %d below 8 bytes", size)
	}
	var hb [4]byte
	binary.LittleEndian.PutUint32(hb[:], uint32(size))
	if _, err := c.Write(hb[:]); err != nil {
		return nil, err
	}
	msg := make([]byte, size)
	back := make([]byte, size)
	rtts := make([]time.Duration, 0, n)
	for i := 0; i < n+warmup; i++ {
		start := time.Now()
		binary.LittleEndian.PutUint64(msg, uint64(start.UnixNano()))
		if _, err := c.Write(msg); err != nil {
			return rtts, err
		}
		if _, err := io.ReadFull(c, back); err != nil {
			return rtts, err
		}
		d := time.Since(start)
		if binary.LittleEndian.Uint64(back) != uint64(start.UnixNano()) {
			return rtts, fmt.Errorf("echo %d carried another timestamp", i)
		}
		if i >= warmup {
			rtts = append(rtts, d)
		}
	}
	return rtts, nil
}
