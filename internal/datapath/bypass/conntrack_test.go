package bypass

import (
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"

	"github.com/eztunnel/eztunnel/internal/bpfsys"
)

// TestConntrackActive: in a new network namespace (loopback up) conntrack
// runs only once a rule needs it; the probe says no, then yes after an nft
// rule with a ct expression, then no again once that table is gone.
func TestConntrackActive(t *testing.T) {
	ns, err := bpfsys.NewNetNS()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	in := func(fn func() error) {
		t.Helper()
		if err := bpfsys.InNetNSHandle(ns, fn); err != nil {
			t.Fatal(err)
		}
	}
	in(func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(lo)
	})
	probe := func(want bool, when string) {
		t.Helper()
		var got bool
		in(func() (err error) { got, err = ConntrackActive(); return err })
		if got != want {
			t.Errorf("%s: conntrack active %v, want %v", when, got, want)
		}
	}
	probe(false, "no rule")
	conn, err := nftables.New(nftables.WithNetNSFd(int(ns)))
	if err != nil {
		t.Fatal(err)
	}
	// table inet ezprobe { chain fwd { type filter hook forward priority 0; ct state established accept } }
	table := conn.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: "ezprobe"})
	chain := conn.AddChain(&nftables.Chain{Name: "fwd", Table: table, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter})
	conn.AddRule(&nftables.Rule{Table: table, Chain: chain, Exprs: []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED), Xor: binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
		&expr.Verdict{Kind: expr.VerdictAccept},
	}})
	if err := conn.Flush(); err != nil {
		t.Fatalf("nftables: %v", err)
	}
	probe(true, "an nft rule with ct state")
	conn.DelTable(table)
	if err := conn.Flush(); err != nil {
		t.Fatalf("nftables: %v", err)
	}
	probe(false, "the rule's table deleted")
}
