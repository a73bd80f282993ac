package e2e

import (
	"bytes"
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/ebpf/rlimit"

	"github.com/eztunnel/eztunnel/internal/datapath"
)

// TestSelection: each selection rule changes what is enrolled, as the
// counters show; connections it excludes still carry every byte.
func TestSelection(t *testing.T) {
	e := newEnv(t, "sel", 24)
	a, b := e.pod("a", true), e.pod("b", true)
	e.serve(b, "--stream", ":7000", "--stream", ":7001", "--stream", "[::]:7006")
	if err := rlimit.RemoveMemlock(); err != nil {
		t.Fatal(err)
	}
	c := streamCase{conns: 10, parallel: 10, up: 64 << 10, down: 64 << 10, chunk: 4096}
	subnet := netip.MustParsePrefix(b.IPv4.String() + "/24").Masked()
	host := netip.PrefixFrom(b.IPv4, 32)

	type probe struct {
		addr   string
		paired bool
	}
	cases := []struct {
		name   string
		sel    datapath.Selection
		probes []probe
	}{
		{"exclude-port", datapath.Selection{ExcludePorts: []uint16{7001}},
			[]probe{{hostport(b.IPv4, 7000), true}, {hostport(b.IPv4, 7001), false}}},
		{"include-port", datapath.Selection{IncludePorts: []uint16{7001}},
			[]probe{{hostport(b.IPv4, 7000), false}, {hostport(b.IPv4, 7001), true}}},
		{"include-cidr", datapath.Selection{IncludeCIDRs: []netip.Prefix{subnet}},
			[]probe{{hostport(b.IPv4, 7000), true}, {hostport(b.IPv6, 7006), false}}},
		{"exclude-cidr-more-specific", datapath.Selection{IncludeCIDRs: []netip.Prefix{subnet}, ExcludeCIDRs: []netip.Prefix{host}},
			[]probe{{hostport(b.IPv4, 7000), false}}},
		{"no-ipv6", datapath.Selection{NoIPv6: true},
			[]probe{{hostport(b.IPv4, 7006), true}, {hostport(b.IPv6, 7006), false}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := e.cfg
			cfg.Select = tc.sel
			dp, err := datapath.Install(cfg, []string{e.lab.Managed})
			if err != nil {
				t.Fatal(err)
			}
			e.dp = dp
			defer func() {
				dp.Close()
				if err := datapath.Uninstall(cfg, 10*time.Second); err != nil {
					t.Errorf("uninstall: %v", err)
				}
			}()
			for _, p := range tc.probes {
				d := e.streamCounted(a, c, p.addr, 5)
				if p.paired {
					requirePaired(t, d, uint64(c.conns), 1, p.addr)
				}
				if !p.paired && (d["pairs"] != 0 || d["sockets_enrolled"] != 0 || d["fallback_excluded"] != uint64(c.conns)) {
					t.Errorf("%s: want excluded (%d fallback_excluded, nothing enrolled), counters %v", p.addr, c.conns, d)
				}
			}
		})
	}
}

// TestSelectionInvalid: contradictory or malformed rules are refused by
// `run` before anything is attached.
func TestSelectionInvalid(t *testing.T) {
	e := newEnv(t, "seli", 25)
	pin := e.pin("/sys/fs/bpf/eztest-seli")
	for _, tc := range []struct {
		args    []string
		message string
	}{
		{[]string{"--include-ports", "80", "--exclude-ports", "80"}, "both included and excluded"},
		{[]string{"--exclude-ports", "70000"}, "out of range"},
		{[]string{"--include-cidrs", "10.0.0.0/33"}, "--include-cidrs"},
		{[]string{"--exclude-cidrs", "10.1.2.3/16"}, "host bits"},
		{[]string{"--ipv6=false", "--include-cidrs", "fd00::/8"}, "IPv6 is disabled"},
	} {
		args := append([]string{"run", "--cgroup", e.lab.Managed, "--pin-path", pin}, tc.args...)
		out, err := eztunnelOut(args...)
		if err == nil {
			t.Errorf("%v succeeded", tc.args)
			continue
		}
		if !contains(out, tc.message) {
			t.Errorf("%v: error does not say %q:\n%s", tc.args, tc.message, out)
		}
		if n := attachedPrograms(t, e.lab.Managed); n != 0 {
			t.Errorf("%v: %d programs left attached", tc.args, n)
		}
	}
}

// TestSelectionChangeOnRestart: new rules, through a restart of the agent,
// apply to new connections; an established connection keeps its path.
func TestSelectionChangeOnRestart(t *testing.T) {
	e, a, b, pin := agentEnv(t, "selr", 33)
	first := startAgent(t, bin, e.lab.Managed, pin)

	// A long connection, accelerated under the first rules.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// Paused halfway until the second agent runs (resume), whatever a
	// restart takes on a loaded machine.
	resume := filepath.Join(t.TempDir(), "resume")
	long := a.Cmd(ctx, labBin, append(streamCase{conns: 1, parallel: 1, up: 64 << 10, down: 64 << 10, chunk: 4096}.args(hostport(b.IPv4, 7000), 8),
		"--pause", "90s", "--resume-file", resume)...)
	var out bytes.Buffer
	long.Stdout, long.Stderr = &out, &out
	if err := a.Start(long); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(scaled(10 * time.Second)); pinnedCounters(t, pin)["pairs"] < 1; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the long connection was not paired")
		}
	}
	first.kill(t)
	startAgent(t, bin, e.lab.Managed, pin, "--exclude-ports", "7000")

	before := pinnedCounters(t, pin)
	if err := os.WriteFile(resume, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := long.Wait(); err != nil {
		t.Fatalf("long connection: %v\n%s", err, out.String())
	}
	mid := pinnedCounters(t, pin)
	if mid["bytes_redirected"] <= before["bytes_redirected"] {
		t.Errorf("the established connection stopped being redirected after the rule change")
	}
	if o, err := e.run(a, streamCase{conns: 5, parallel: 5, up: 1 << 16, down: 1 << 16, chunk: 4096}.args(hostport(b.IPv4, 7000), 9)...); err != nil {
		t.Fatalf("%v\n%s", err, o)
	}
	after := pinnedCounters(t, pin)
	if after["pairs"] != mid["pairs"] || after["fallback_excluded"]-mid["fallback_excluded"] != 5 {
		t.Errorf("new connections under --exclude-ports 7000: pairs %d -> %d, excluded +%d (want +5)",
			mid["pairs"], after["pairs"], after["fallback_excluded"]-mid["fallback_excluded"])
	}
}
