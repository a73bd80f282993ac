package tracer

import (
	"os"
	"testing"
)

// TestTracerVerifies loads every tracer program with a filter set: the
// verifier must accept them all (nothing is attached).
func TestTracerVerifies(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("loading eBPF programs needs root: run go test as root")
	}
	objs, err := load(Config{TableSize: 1024, RingSize: 1 << 20, Filter: Filter{Family: 4, Port: 80}})
	if err != nil {
		t.Fatal(err)
	}
	defer objs.Close()
	if objs.TrcNfRawBefore == nil || objs.TrcTcxeFirst == nil || objs.TrcBtfNetifRx == nil {
		t.Fatal("programs missing after load")
	}
}
