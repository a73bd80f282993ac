package workload

import (
	"net"
	"testing"
)

// TestStreamsOverLoopback: byte-exact streams, pipelined and with the
// opening request/response, against the stream server over plain loopback
// TCP (what the e2e tests then run through eztunnel).
func TestStreamsOverLoopback(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go ServeStream(ln)
	for _, hs := range []bool{false, true} {
		for _, duplex := range []bool{false, true} {
			o := StreamOptions{Addr: ln.Addr().String(), Conns: 3, Up: 1 << 20, Down: 300 << 10, Chunk: 4096, Seed: 7, Handshake: hs, Duplex: duplex}
			if fails := RunStreams(o); fails != nil {
				t.Errorf("handshake=%v duplex=%v: %v", hs, duplex, fails)
			}
		}
	}
}
