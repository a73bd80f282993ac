package meshmatrix

// One eztunnel agent per node, as in `bench bypass` (lab/bench/bypass),
// with the flags of each configuration.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/eztunnel/eztunnel/internal/datapath"
	"github.com/eztunnel/eztunnel/lab/bench/bypass"
	"github.com/eztunnel/eztunnel/lab/multinode"
	"github.com/eztunnel/eztunnel/lab/workload"
)

const metricsAddr = "127.0.0.1:9464" // each agent's metrics, in its node's namespace

// agentArgs are the flags that make an agent run configuration cfg (after
// the common ones); nil for the baseline (no agent).
func agentArgs(cfg string) []string {
	switch cfg {
	case ShortcutOnly:
		return []string{"--bypass=false"}
	case BypassOnly:
		// Every connection excluded from the shortcut: tc only.
		return []string{"--bypass", "--exclude-cidrs", "0.0.0.0/0,::/0"}
	case Both:
		return []string{"--bypass"}
	case Idle:
		return []string{"--bypass=false", "--exclude-cidrs", "0.0.0.0/0,::/0"}
	}
	return nil
}

// pinPath is where the agent of node n pins its datapath.
func pinPath(n *multinode.Node) string { return "/sys/fs/bpf/eztunnel-meshmatrix-" + n.NetNS }

// sweepPins uninstalls what the agents of a killed run left pinned.
func sweepPins(nodes ...*multinode.Node) error {
	for _, n := range nodes {
		cfg := datapath.DefaultConfig()
		cfg.PinRoot = pinPath(n)
		if _, err := os.Stat(cfg.PinRoot); err == nil {
			if err := datapath.Uninstall(cfg, 0); err != nil {
				return fmt.Errorf("pins of a killed run at %s: %w", cfg.PinRoot, err)
			}
			os.Remove(cfg.PinRoot)
		}
	}
	return nil
}

// agents is one eztunnel agent per node, or none (the baseline).
type agents struct {
	exe   string
	nodes []*multinode.Node
	stops []func() error
	logs  []*bytes.Buffer
	pins  []string
}

// startAgents starts an agent in each node's namespace for cfg and waits
// until each is ready and, with the bypass, has every pod of its node as an
// endpoint.
func startAgents(ctx context.Context, exe, cfg, tmp string, nodes ...*multinode.Node) (*agents, error) {
	a := &agents{exe: exe}
	if cfg == Baseline {
		return a, nil
	}
	for _, n := range nodes {
		pin := pinPath(n)
		ready := filepath.Join(tmp, n.NetNS+"-ready")
		os.Remove(ready)
		args := []string{"run", "--cgroup", n.Managed, "--pin-path", pin,
			"--lock-file", filepath.Join(tmp, n.NetNS+".lock"), "--adopt=false",
			"--metrics-addr", metricsAddr, "--ready-file", ready}
		args = append(args, agentArgs(cfg)...)
		cctx, cancel := context.WithCancel(ctx)
		cmd := n.Cmd(cctx, exe, args...)
		logs := &bytes.Buffer{}
		cmd.Stdout, cmd.Stderr = logs, logs
		if err := n.Start(cmd); err != nil {
			cancel()
			a.stop()
			return nil, fmt.Errorf("agent on %s: %w", n.Name, err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		a.nodes, a.logs, a.pins = append(a.nodes, n), append(a.logs, logs), append(a.pins, pin)
		a.stops = append(a.stops, func() error {
			cmd.Process.Signal(syscall.SIGTERM)
			select {
			case err := <-exited:
				cancel()
				return err
			case <-time.After(30 * time.Second):
				cancel()
				return errors.New("no exit 30 s after SIGTERM")
			}
		})
		if err := workload.WaitReady(ctx, ready, 30*time.Second, nil); err != nil {
			a.stop()
			return nil, fmt.Errorf("agent on %s: %w\n%s", n.Name, err, logs.String())
		}
		if cfg == BypassOnly || cfg == Both {
			if err := waitEndpoints(ctx, n); err != nil {
				a.stop()
				return nil, fmt.Errorf("agent on %s: %w\n%s", n.Name, err, logs.String())
			}
		}
	}
	return a, nil
}

// waitEndpoints makes node n resolve each of its pods, as kubelet's probes
// do (the bypass learns a pod's MAC from the node's neighbour entry), and
// waits until the agent lists them as endpoints.
func waitEndpoints(ctx context.Context, n *multinode.Node) error {
	pods := n.Pods()
	deadline := time.Now().Add(20 * time.Second)
	for {
		for _, p := range pods {
			if err := n.Do(func() error {
				c, err := net.Dial("udp", netip.AddrPortFrom(p.IPv4, 9).String())
				if err != nil {
					return err
				}
				defer c.Close()
				_, err = c.Write([]byte("probe"))
				return err
			}); err != nil {
				return fmt.Errorf("%s -> %s: %w", n.Name, p.Name, err)
			}
		}
		m, err := bypass.Scrape(n, metricsAddr)
		if err == nil && m["eztunnel_bypass_endpoints"] >= float64(len(pods)) {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%d of %d pods are bypass endpoints after 20 s (%v)", int(m["eztunnel_bypass_endpoints"]), len(pods), err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// stop stops the agents and uninstalls what they pinned.
func (a *agents) stop() error {
	var errs []error
	for i, stop := range a.stops {
		if err := stop(); err != nil {
			errs = append(errs, fmt.Errorf("agent on %s: %w\n%s", a.nodes[i].Name, err, a.logs[i].String()))
		}
		var out bytes.Buffer
		cmd := a.nodes[i].Cmd(context.Background(), a.exe, "uninstall", "--pin-path", a.pins[i], "--drain-timeout", "10s")
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := a.nodes[i].Run(cmd); err != nil {
			errs = append(errs, fmt.Errorf("uninstall on %s: %w: %s", a.nodes[i].Name, err, out.String()))
		}
	}
	a.stops = nil
	return errors.Join(errs...)
}

// counters are what the agents did, summed over both nodes.
type counters struct {
	redirected float64 // messages the socket shortcut moved (sk_msg)
	pairs      float64 // connections paired on the shortcut
	bypassed   float64 // packets the tc bypass redirected: same node, out to and in from the other node
	fallbacks  map[string]float64
}

func (c counters) sub(b counters) counters {
	d := counters{redirected: c.redirected - b.redirected, pairs: c.pairs - b.pairs, bypassed: c.bypassed - b.bypassed,
		fallbacks: map[string]float64{}}
	for r, v := range c.fallbacks {
		if x := v - b.fallbacks[r]; x > 0 {
			d.fallbacks[r] = x
		}
	}
	return d
}

// counters reads every agent's metrics (zero without agents).
func (a *agents) counters() (counters, error) {
	c := counters{fallbacks: map[string]float64{}}
	for _, n := range a.nodes {
		m, err := bypass.Scrape(n, metricsAddr)
		if err != nil {
			return c, err
		}
		for k, v := range m {
			if r, ok := strings.CutPrefix(k, "fallback "); ok {
				c.fallbacks[r] += v
			}
		}
		c.redirected += m["eztunnel_messages_redirected_total"]
		c.pairs += m["eztunnel_pairs_total"]
		c.bypassed += m["eztunnel_bypass_packets_total"] + m["eztunnel_bypass_out_packets_total"] + m["eztunnel_bypass_in_packets_total"]
	}
	return c, nil
}
