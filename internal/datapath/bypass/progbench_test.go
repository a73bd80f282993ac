package bypass

import (
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// BenchmarkProgBypass times ez_bypass in the kernel (BPF_PROG_TEST_RUN
// with repeat: one syscall for b.N runs) on a
// same-node frame that leaves it unchanged, so every repeat decides alike:
// checked in full (--bypass-recheck=0), on the flow cache, and paused.
// Run with: go test -run '^$' -bench ProgBypass ./internal/datapath/bypass/
func BenchmarkProgBypass(b *testing.B) {
	const A, B = "10.244.1.4", "10.244.1.5"
	pkt := ether(podBMAC, podAMAC, 0x0800, ip4(A, B, 64, unix.IPPROTO_UDP, 0, nil, udp(40001, 53, 32)))
	ct := est(unix.IPPROTO_UDP, A, B, 40001, 53, admitOrig)
	for _, c := range []struct {
		name    string
		recheck time.Duration
		paused  bool
		ret     uint32
	}{
		{"full", 0, false, tcActRedirect},
		{"cached", time.Hour, false, tcActRedirect},
		{"paused", time.Hour, true, tcxNext},
	} {
		b.Run(c.name, func(b *testing.B) {
			l := newLab(b, Options{Recheck: c.recheck})
			l.reset(b)
			l.addCT(b, ct)
			if c.paused {
				must(b, "pause", (&Switch{m: l.objs.EzBpSwitch}).Pause(true))
			}
			ctx := skbCtx{Ifindex: uint32(l.ifx["vethA"])}
			if ret, _, _ := l.run(b, l.objs.EzBypass, pkt, ctx); ret != c.ret {
				b.Fatalf("verdict %#x, want %#x", ret, c.ret)
			}
			b.ResetTimer()
			opts := &ebpf.RunOptions{Data: pkt, Context: ctx, Repeat: uint32(max(b.N, 1))}
			var ret uint32
			var err error
			start := time.Now()
			l.do(b, func() { ret, err = l.objs.EzBypass.Run(opts) })
			took := time.Since(start)
			if err != nil {
				b.Fatal(err)
			}
			if ret != c.ret {
				b.Fatalf("verdict %#x after repeats, want %#x", ret, c.ret)
			}
			b.ReportMetric(float64(took.Nanoseconds())/float64(opts.Repeat), "ns/run")
		})
	}
}
