package workload

import (
	"io"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// TestPingPongUntil: the warm-up goes on until warmUntil says so, then n
// round trips are recorded.
func TestPingPongUntil(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[0])
	echoed := make(chan int, 1)
	go func() {
		f := os.NewFile(uintptr(fds[1]), "echo")
		defer f.Close()
		var hdr [4]byte
		if _, err := io.ReadFull(f, hdr[:]); err != nil {
			echoed <- -1
			return
		}
		msg, n := make([]byte, 16), 0
		for {
			if _, err := io.ReadFull(f, msg); err != nil {
				echoed <- n
				return
			}
			if _, err := f.Write(msg); err != nil {
				echoed <- -1
				return
			}
			n++
		}
	}()
	asked := 0
	rtts, err := PingPongUntil(fds[0], 16, 3, 2, 0, func() bool { asked++; return asked == 5 })
	if err != nil {
		t.Fatal(err)
	}
	unix.Shutdown(fds[0], unix.SHUT_WR)
	// Asked before round trips 2 to 6; true at the fifth ask (round trip
	// 6), so round trips 0-5 warm up and 6-8 are recorded.
	if got := <-echoed; len(rtts) != 3 || asked != 5 || got != 9 {
		t.Errorf("%d recorded, asked %d times, %d echoed; want 3, 5, 9", len(rtts), asked, got)
	}
}
