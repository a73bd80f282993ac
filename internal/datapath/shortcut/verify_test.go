package shortcut

import (
	"errors"
	"os"
	"testing"

	"github.com/cilium/ebpf"
)

// TestShortcutVerifies loads every program of the shortcut object: the
// verifier must accept them all (nothing is attached).
func TestShortcutVerifies(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("loading eBPF programs needs root: run go test as root")
	}
	var objs shortcutObjects
	if err := loadShortcutObjects(&objs, nil); err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			t.Fatalf("%+v", ve)
		}
		t.Fatal(err)
	}
	defer objs.Close()
	if objs.EzSockops == nil || objs.EzEgress == nil || objs.EzMsg == nil || objs.EzNat == nil {
		t.Fatal("programs missing after load")
	}
}
