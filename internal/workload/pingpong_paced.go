package workload

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"time"
)

// PingPongPaced is PingPong with the sends paced: message i leaves at
// start + i*interval (or at once when the previous echo came back later),
// as the dissertation's ping-echo client sends one message every 100 ms.
// Each message carries its send timestamp, which the echo must return.
func PingPongPaced(fd, size, n, warmup int, interval time.Duration) ([]time.Duration, error) {
	if size < 8 {
		return nil, fmt.Errorf("message size %d below 8 bytes", size)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var hb [4]byte
	binary.LittleEndian.PutUint32(hb[:], uint32(size))
	if err := writeFull(fd, hb[:]); err != nil {
		return nil, err
	}
	msg := make([]byte, size)
	back := make([]byte, size)
	rtts := make([]time.Duration, 0, n)
	begin := time.Now()
	for i := 0; i < n+warmup; i++ {
		if wait := time.Until(begin.Add(time.Duration(i) * interval)); wait > 0 {
			time.Sleep(wait)
		}
		start := time.Now()
		binary.LittleEndian.PutUint64(msg, uint64(start.UnixNano()))
		if err := writeFull(fd, msg); err != nil {
			return rtts, err
		}
		if err := readFull(fd, back); err != nil {
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
