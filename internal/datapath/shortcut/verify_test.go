package shortcut

import (
	"errors"
	"fmt"
	"os"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/eztunnel/eztunnel/internal/bpfsys"
)

// TestShortcutVerifies loads every program of the shortcut object: the
// verifier must accept them all (nothing is attached). Configuration flags
// are load-time constants, so the verifier prunes the branches of flags
// that are off: the cases are read from the object's own enum ez_cfg_flag
// (no flag, each flag alone, every flag), so a flag added to
// bpf/shortcut/shortcut.h is verified without editing this test.
func TestShortcutVerifies(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("loading eBPF programs needs root: run go test as root")
	}
	cases := configFlagCases(t)
	for _, flags := range cases {
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
			// ez_sc_splice_fe likewise: rx_spliced_sk is verified through ez_sc_splice.
			if err := bpfsys.Fentry(spliceFunc)(); err != nil {
				t.Logf("%s not loaded: %v", shortcutProgEzScSpliceFe, err)
				delete(spec.Programs, shortcutProgEzScSpliceFe)
			}
			// ez_sc_conns_all likewise: conn_record is verified through ez_sc_conns.
			if err := bpfsys.MapElemIter("bpf_sk_storage_map")(); err != nil {
				t.Logf("%s not loaded: %v", shortcutProgEzScConnsAll, err)
				delete(spec.Programs, shortcutProgEzScConnsAll)
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

// configFlagCases returns no flag, each value of enum ez_cfg_flag alone, and
// all of them together, read from the object's BTF.
func configFlagCases(t *testing.T) []shortcutEzCfgFlag {
	t.Helper()
	spec, err := loadShortcut()
	if err != nil {
		t.Fatal(err)
	}
	var enum *btf.Enum
	if err := spec.Types.TypeByName("ez_cfg_flag", &enum); err != nil {
		t.Fatalf("enum ez_cfg_flag in the object's BTF: %v", err)
	}
	if len(enum.Values) < 6 {
		t.Fatalf("enum ez_cfg_flag has %d values, want at least the 6 known ones", len(enum.Values))
	}
	cases := []shortcutEzCfgFlag{0}
	var all shortcutEzCfgFlag
	for _, v := range enum.Values {
		if v.Value == 0 || v.Value&(v.Value-1) != 0 {
			t.Fatalf("ez_cfg_flag %s = %#x is not a single bit", v.Name, v.Value)
		}
		cases = append(cases, shortcutEzCfgFlag(v.Value))
		all |= shortcutEzCfgFlag(v.Value)
	}
	return append(cases, all)
}
