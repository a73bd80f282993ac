package deploy

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/eztunnel/eztunnel/internal/sysexec"
)

// TestChartAcceptsWhatTheAgentAccepts: at every boundary of every value the
// chart turns into an agent flag, the chart's schema and templates accept
// exactly what the agent's flag parsing and validation accept (`eztunnel
// run --dry-run`, the agent built from this tree, given the chart's default
// arguments and then the flag): a value the chart renders never makes every
// node's agent refuse to start, and the chart refuses nothing the agent
// would run with.
func TestChartAcceptsWhatTheAgentAccepts(t *testing.T) {
	bin := agent(t)
	base := strs(container(t, render(t))["args"])
	for i, a := range base {
		base[i] = strings.ReplaceAll(a, "$(NODE_NAME)", "node-1")
	}
	// value: its --set, and the agent flag it renders, at each point.
	type at struct{ set, flag string }
	cases := map[string][]at{
		"pairMaxAge": {{"0s", "--pair-max-age=0s"}, {"-1s", "--pair-max-age=-1s"}, {"1ns", "--pair-max-age=1ns"},
			{"60s", "--pair-max-age=60s"}, {"1h30m", "--pair-max-age=1h30m"}, {"60", "--pair-max-age=60"}, {"soon", "--pair-max-age=soon"}},
		"takeoverTimeout": {{"0s", "--takeover-timeout=0s"}, {"-1s", "--takeover-timeout=-1s"}, {"90s", "--takeover-timeout=90s"},
			{"2m", "--takeover-timeout=2m"}, {"x", "--takeover-timeout=x"}},
		"adoption.interval": {{"0s", "--adopt-interval=0s"}, {"-1s", "--adopt-interval=-1s"}, {"30s", "--adopt-interval=30s"},
			{"1m", "--adopt-interval=1m"}, {"often", "--adopt-interval=often"}},
		"metrics.port": {{"0", "--metrics-addr=0.0.0.0:0"}, {"1", "--metrics-addr=0.0.0.0:1"}, {"65535", "--metrics-addr=0.0.0.0:65535"},
			{"65536", "--metrics-addr=0.0.0.0:65536"}},
		"health.port": {{"0", "--health-addr=127.0.0.1:0"}, {"1", "--health-addr=127.0.0.1:1"}, {"65535", "--health-addr=127.0.0.1:65535"},
			{"65536", "--health-addr=127.0.0.1:65536"}},
		"bindAddress": {{"127.0.0.1", "--metrics-addr=127.0.0.1:9876"}, {"::", "--metrics-addr=[::]:9876"}, {"0.0.0.0", "--metrics-addr=0.0.0.0:9876"},
			{"node-1", "--metrics-addr=node-1:9876"}, {"300.1.1.1", "--metrics-addr=300.1.1.1:9876"}},
		"health.bindAddress": {{"10.0.0.7", "--health-addr=10.0.0.7:9877"}, {"fe80::1", "--health-addr=[fe80::1]:9877"},
			{"localhost", "--health-addr=localhost:9877"}},
		"bypass": {{"auto", "--bypass=auto"}, {"on", "--bypass=on"}, {"off", "--bypass=off"}, {"true", "--bypass=true"},
			{"false", "--bypass=false"}, {"maybe", "--bypass=maybe"}},
		"defaultPolicy": {{"enabled", "--default-policy=enabled"}, {"disabled", "--default-policy=disabled"}, {"on", "--default-policy=on"}},
		"cgroupDriver": {{"auto", "--cgroup-driver=auto"}, {"systemd", "--cgroup-driver=systemd"}, {"cgroupfs", "--cgroup-driver=cgroupfs"},
			{"cgroupv2", "--cgroup-driver=cgroupv2"}},
		"log.level":  {{"debug", "--log-level=debug"}, {"error", "--log-level=error"}, {"trace", "--log-level=trace"}},
		"log.format": {{"json", "--log-format=json"}, {"text", "--log-format=text"}, {"xml", "--log-format=xml"}},
	}
	checked := 0
	for value, points := range cases {
		for _, p := range points {
			set := "--set-string" // durations and words stay strings ("60" too)
			if strings.HasSuffix(value, ".port") {
				set = "--set" // numbers
			}
			_, err := helm(t, "template", "eztunnel", chartDir, "--namespace", "kube-system", set, value+"="+p.set)
			chartOK := err == nil
			agentOK, out := dryRun(t, bin, append(base, p.flag))
			if chartOK != agentOK {
				t.Errorf("%s=%s: the chart accepts it %v (%v), the agent (%s) %v:\n%s", value, p.set, chartOK, err, p.flag, agentOK, out)
			}
			checked++
		}
	}
	// The chart's defaults themselves run.
	if ok, out := dryRun(t, bin, base); !ok {
		t.Fatalf("the agent refuses the chart's default arguments %v:\n%s", base, out)
	}
	t.Logf("%d boundary values of %d chart values agree", checked, len(cases))
}

// dryRun runs `eztunnel run --dry-run args` as the chart's pod would (its
// downward-API environment).
func dryRun(t *testing.T, bin string, args []string) (bool, string) {
	t.Helper()
	if len(args) == 0 || args[0] != "run" {
		t.Fatalf("the chart's arguments do not start with run: %v", args)
	}
	cmd := sysexec.Command(context.Background(), bin, append([]string{"run", "--dry-run"}, args[1:]...)...)
	cmd.Env = append(os.Environ(), "POD_NAMESPACE=kube-system", "POD_NAME=eztunnel-x", "NODE_NAME=node-1")
	out, err := cmd.CombinedOutput()
	return err == nil, fmt.Sprintf("%s", out)
}
