package shortcut

import (
	"errors"
	"fmt"
	"os"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/eztunnel/eztunnel/internal/bpfsys"
)

// TestShortcutVerifies loads every program of the shortcut object: the
// verifier must accept them all (nothing is attached). Configuration flags
// are load-time constants, so the verifier prunes the branches of flags
// that are off: every flag is tried off and on.
func TestShortcutVerifies(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("loading eBPF programs needs root: run go test as root")
	}
	all := shortcutEzCfgFlagEZ_CFG_NO_IPV6 | shortcutEzCfgFlagEZ_CFG_PORT_ALLOWLIST |
		shortcutEzCfgFlagEZ_CFG_CIDR_ALLOWLIST | shortcutEzCfgFlagEZ_CFG_CGROUP_FILTER
	gauge := shortcutEzCfgFlagEZ_CFG_RX_GAUGE
	for _, flags := range []shortcutEzCfgFlag{0, shortcutEzCfgFlagEZ_CFG_CGROUP_FILTER, all, gauge, all | gauge} {
		t.Run(fmt.Sprintf("flags=%#x", uint32(flags)), func(t *testing.T) {
			spec, err := loadShortcut()
			if err != nil {
				t.Fatal(err)
			}
			if err := spec.Variables["ez_cfg_flags"].Set(uint32(flags)); err != nil {
				t.Fatal(err)
			}
			// ez_sc_recv_fx is ez_sc_recv's body on another hook; a host that
			// refuses fexit (bpfsys.Fexit) verifies it through ez_sc_recv.
			if err := bpfsys.Fexit(recvFunc)(); err != nil {
				t.Logf("%s not loaded: %v", shortcutProgEzScRecvFx, err)
				delete(spec.Programs, shortcutProgEzScRecvFx)
			}
			// ez_sc_nat_ct likewise: nat_learn is verified through ez_sc_nat.
			if err := bpfsys.Fentry(confirmFunc)(); err != nil {
				t.Logf("%s not loaded: %v", shortcutProgEzScNatCt, err)
				delete(spec.Programs, shortcutProgEzScNatCt)
			}
			coll, err := ebpf.NewCollection(spec)
			if err != nil {
				var ve *ebpf.VerifierError
				if errors.As(err, &ve) {
					t.Fatalf("%+v", ve)
				}
				t.Fatal(err)
			}
			defer coll.Close()
			for name := range spec.Programs {
				if coll.Programs[name] == nil {
					t.Fatalf("program %s missing after load", name)
				}
			}
		})
	}
}
