package workload

import (
	"bytes"
	"encoding/json"
	"net"
	"strings"
	"sync"
	"testing"
)

// TestServeEchoPhases: against an echo server on loopback, each phase opens
// its own set of fresh connections and answers with its round trips and
// their median; a malformed request line ends the run with an error.
func TestServeEchoPhases(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var mu sync.Mutex
	accepted := 0
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			accepted++
			mu.Unlock()
			go func() {
				defer c.Close()
				var hdr [4]byte
				if _, err := readAll(c, hdr[:]); err != nil {
					return
				}
				buf := make([]byte, 24)
				for {
					if _, err := readAll(c, buf); err != nil {
						return
					}
					if _, err := c.Write(buf); err != nil {
						return
					}
				}
			}()
		}
	}()
	addr := ln.Addr().String()
	in := addr + " 20ms 3 24\n" + addr + " 20ms 2 24\n"
	var out bytes.Buffer
	if err := ServeEchoPhases(strings.NewReader(in), &out); err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(&out)
	for i := range 2 {
		var ph EchoPhase
		if err := dec.Decode(&ph); err != nil {
			t.Fatalf("phase %d: %v", i, err)
		}
		if ph.Err != "" || ph.N < 1 || ph.MedianUs <= 0 {
			t.Errorf("phase %d: %+v", i, ph)
		}
	}
	mu.Lock()
	if accepted != 5 {
		t.Errorf("%d connections accepted, want 3 + 2 (fresh ones per phase)", accepted)
	}
	mu.Unlock()
	if err := ServeEchoPhases(strings.NewReader(addr+" 20ms\n"), &out); err == nil {
		t.Error("a malformed request line was accepted")
	}
}

func readAll(c net.Conn, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		m, err := c.Read(b[n:])
		if err != nil {
			return n, err
		}
		n += m
	}
	return n, nil
}
