package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/eztunnel/eztunnel/internal/agent"
	"github.com/eztunnel/eztunnel/internal/agentlock"
	"github.com/eztunnel/eztunnel/internal/agentlog"
	"github.com/eztunnel/eztunnel/internal/cli"
	"github.com/eztunnel/eztunnel/internal/datapath"
)

type runConfig struct {
	cgroups   []string
	dp        datapath.Config
	readyFile string
	metrics   string
	health    string
	selection selectionFlags
	pairAge   time.Duration
	lockFile  string
	takeover  bool
	lockWait  time.Duration
	kube      kubeFlags
	adopt     bool
	adoptIvl  time.Duration
	services  bool
	svcFile   string
	nodePort  bool
	npDevs    []string
	hcAddrs   []string
}

func runCmd() *cobra.Command {
	rc := runConfig{dp: datapath.DefaultConfig()}
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Attach the socket shortcut and serve until stopped (the datapath stays pinned)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return run(ctx, cmd.Flags(), rc)
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&rc.cgroups, "cgroup", nil, "cgroup v2 path(s) to manage (default: the cgroup v2 root from /proc/mounts)")
	layoutFlags(f, &rc.dp, &rc.lockFile)
	f.Uint32Var(&rc.dp.MaxSockets, "max-sockets", rc.dp.MaxSockets, "sockhash size (two entries per accelerated connection)")
	f.Uint32Var(&rc.dp.MaxPairs, "max-pairs", rc.dp.MaxPairs, "connections in setup at once")
	f.Uint32Var(&rc.dp.MaxUnread, "max-unread", 0, "bytes a connection's receiver may leave unread before the connection switches to the kernel path for good (0: the receiver's SO_RCVBUF if set, else min(tcp_rmem max, 4 MiB))")
	f.StringVar(&rc.readyFile, "ready-file", "", "file created once everything is attached (for scripts and tests)")
	f.DurationVar(&rc.pairAge, "pair-max-age", 60*time.Second, "age after which unclaimed or ambiguous pairing records are removed")
	rc.selection.register(f)
	f.StringVar(&rc.metrics, "metrics-addr", "", "serve Prometheus metrics on this host:port at /metrics (default off)")
	f.StringVar(&rc.health, "health-addr", "", "serve /healthz and /readyz on this host:port (default off)")
	f.BoolVar(&rc.takeover, "takeover", false, "if another agent runs, ask it to hand over (it stands by until stopped) instead of refusing")
	f.DurationVar(&rc.lockWait, "takeover-timeout", 60*time.Second, "how long --takeover waits for the running agent to hand over")
	f.BoolVar(&rc.adopt, "adopt", true, "adopt connections established before the agent (once ready, every --adopt-interval, and on eztunnel adopt) when that is provably safe")
	f.DurationVar(&rc.adoptIvl, "adopt-interval", 30*time.Second, "how often to look for connections to adopt (0: only once ready and on eztunnel adopt)")
	rc.dp.Families.Bypass.Register(f)
	f.BoolVar(&rc.services, "services", false, "Service load balancing, first slice: ClusterIP TCP and UDP translated to a backend at the socket (cgroup connect/sendmsg/recvmsg/getpeername on the managed cgroups; pinned with the datapath: translated sockets keep their translation across restarts; off removes a pinned one); fed by --services-file, else the Kubernetes API (--kubeconfig or in-cluster)")
	f.StringVar(&rc.svcFile, "services-file", "", "with --services: a YAML or JSON file of frontends and backends (hosts without Kubernetes), re-read when it changes")
	f.BoolVar(&rc.nodePort, "nodeport", false, "with --services: NodePorts too, for traffic from outside the node (tcx ingress on the node's devices; the flow's conntrack entry gets the NAT, so the node's firewall still decides); externalTrafficPolicy Local uses the endpoints of --node-name (default $NODE_NAME, else the hostname)")
	f.StringSliceVar(&rc.npDevs, "nodeport-devices", nil, "with --nodeport: the devices NodePorts answer on (default: every device of the agent's network namespace with a global address that is not a bridge port or loopback); the node addresses are theirs")
	f.StringSliceVar(&rc.hcAddrs, "healthcheck-addresses", nil, "with --nodeport and the Kubernetes API: the addresses the healthCheckNodePorts of LoadBalancer Services with externalTrafficPolicy Local are served on, as kube-proxy serves them (default: every address; give others where kube-proxy still runs on the node)")
	rc.kube.register(f)
	f.MarkHidden("ready-file")
	return cmd
}

func run(ctx context.Context, flags *pflag.FlagSet, rc runConfig) error {
	sel, err := rc.selection.parse()
	if err != nil {
		return err
	}
	rc.dp.Select = sel
	rc.dp.Families.Bypass.Parse(flags)
	if rc.lockFile == "" {
		rc.lockFile = rc.dp.Layout().Lock()
	}
	kc, err := rc.kube.parse(flags, rc.services)
	if err != nil {
		return err
	}
	var svc *agent.ServicesConfig
	if rc.services {
		svc = &agent.ServicesConfig{File: rc.svcFile, Kubeconfig: rc.kube.cfg.Kubeconfig,
			NodePort: rc.nodePort, NodePortDevices: rc.npDevs, NodeName: rc.kube.cfg.NodeName, HealthCheckAddrs: rc.hcAddrs}
		if rc.svcFile != "" && flags.Changed("kubeconfig") {
			return fmt.Errorf("--services-file and --kubeconfig exclude each other: the services come from one source")
		}
	} else if rc.svcFile != "" {
		return fmt.Errorf("--services-file needs --services")
	} else if rc.nodePort || len(rc.npDevs) > 0 {
		return fmt.Errorf("--nodeport and --nodeport-devices need --services")
	}
	if len(rc.npDevs) > 0 && !rc.nodePort {
		return fmt.Errorf("--nodeport-devices needs --nodeport")
	}
	if len(rc.hcAddrs) > 0 && (!rc.nodePort || rc.svcFile != "") {
		return fmt.Errorf("--healthcheck-addresses needs --nodeport with the Kubernetes API (not --services-file)")
	}
	for _, a := range rc.hcAddrs {
		if _, err := netip.ParseAddr(a); err != nil {
			return fmt.Errorf("--healthcheck-addresses: %q is not an IP address", a)
		}
	}
	if rc.adoptIvl < 0 {
		return fmt.Errorf("--adopt-interval %s must not be negative", rc.adoptIvl)
	}
	stopLevels := followLogLevel(rc.dp.Layout().LogLevel())
	defer stopLevels()
	agentlock.Signals = "SIGUSR1 SIGUSR2" // adoption (internal/agent), log level (followLogLevel)
	// The last MiB of the log, for `eztunnel bugreport` on the node. An
	// agent that stops before installing anything takes a new file away.
	logPath := rc.dp.Layout().Log()
	_, statErr := os.Stat(logPath)
	if tl, err := agentlog.Open(logPath, 1<<20); err != nil {
		slog.Warn("no log file for eztunnel bugreport", "err", err)
	} else {
		defer tl.Close()
		if err := cli.TeeLogs(tl); err != nil {
			return err
		}
	}
	err = agent.Run(ctx, agent.Config{
		Cgroups: rc.cgroups, Datapath: rc.dp, ReadyFile: rc.readyFile,
		MetricsAddr: rc.metrics, HealthAddr: rc.health, PairMaxAge: rc.pairAge, Version: version,
		LockFile: rc.lockFile, Takeover: rc.takeover, LockWait: rc.lockWait, Kubernetes: kc,
		Adopt: rc.adopt, AdoptEvery: rc.adoptIvl, Services: svc,
	})
	if _, perr := os.Stat(rc.dp.Dir()); err != nil && os.IsNotExist(statErr) && os.IsNotExist(perr) {
		os.Remove(logPath)
	}
	return err
}
