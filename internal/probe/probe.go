// Package probe checks, before anything is loaded, that this kernel and
// process can run the datapath, and names what is missing.
package probe

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/features"
)

// Requirement is one thing the datapath needs.
type Requirement struct {
	Name  string
	Check func() error
}

// Shortcut lists what the socket shortcut needs.
var Shortcut = []Requirement{
	{"root (CAP_BPF, CAP_NET_ADMIN, CAP_SYS_ADMIN)", checkRoot},
	{"kernel BTF (/sys/kernel/btf/vmlinux)", checkBTF},
	{"program type sock_ops", progType(ebpf.SockOps)},
	{"program type sk_msg", progType(ebpf.SkMsg)},
	{"program type cgroup_skb", progType(ebpf.CGroupSKB)},
	{"program type netfilter (BPF netfilter links, Linux 6.4)", progType(ebpf.Netfilter)},
	{"map type sockhash", mapType(ebpf.SockHash)},
	{"map type sk_storage", mapType(ebpf.SkStorage)},
	{"helper bpf_msg_redirect_hash (sk_msg)", helper(ebpf.SkMsg, asm.FnMsgRedirectHash)},
	{"helper bpf_sk_storage_get (sk_msg)", helper(ebpf.SkMsg, asm.FnSkStorageGet)},
	{"helper bpf_get_netns_cookie (sock_ops)", helper(ebpf.SockOps, asm.FnGetNetnsCookie)},
}

// Check runs every requirement and returns one error naming all that failed.
func Check(reqs []Requirement) error {
	var missing []string
	for _, r := range reqs {
		if err := r.Check(); err != nil {
			missing = append(missing, fmt.Sprintf("%s: %v", r.Name, err))
		}
	}
	if len(missing) == 0 {
		return nil
	}
	return fmt.Errorf("kernel or process cannot run eztunnel:\n  - %s", strings.Join(missing, "\n  - "))
}

func checkRoot() error {
	if os.Geteuid() != 0 {
		return errors.New("not running as root")
	}
	return nil
}

func checkBTF() error {
	_, err := btf.LoadKernelSpec()
	return err
}

func progType(t ebpf.ProgramType) func() error {
	return func() error { return features.HaveProgramType(t) }
}

func mapType(t ebpf.MapType) func() error {
	return func() error { return features.HaveMapType(t) }
}

func helper(pt ebpf.ProgramType, fn asm.BuiltinFunc) func() error {
	return func() error { return features.HaveProgramHelper(pt, fn) }
}
