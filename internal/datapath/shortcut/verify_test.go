package shortcut

import (
	"errors"
	"fmt"
	"os"
	"testing"

	"github.com/cilium/ebpf"
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
			var objs shortcutObjects
			if err := spec.LoadAndAssign(&objs, nil); err != nil {
				var ve *ebpf.VerifierError
				if errors.As(err, &ve) {
					t.Fatalf("%+v", ve)
				}
				t.Fatal(err)
			}
			defer objs.Close()
			if objs.EzScSockops == nil || objs.EzScEgress == nil || objs.EzScMsg == nil || objs.EzScNat == nil {
				t.Fatal("programs missing after load")
			}
		})
	}
}
