package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
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
	cfg       agent.Config // the families' options (Datapath.Families, Services)
	dryRun    bool
	resetDevs string // --close-reset-devices
}

func runCmd() *cobra.Command {
	rc := runConfig{cfg: agent.Config{Datapath: datapath.DefaultConfig()}}
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
	layoutFlags(f, &rc.cfg.Datapath, &rc.lockFile)
	f.Uint32Var(&rc.cfg.Datapath.MaxSockets, "max-sockets", rc.cfg.Datapath.MaxSockets, "sockhash size (two entries per accelerated connection)")
	f.Uint32Var(&rc.cfg.Datapath.MaxPairs, "max-pairs", rc.cfg.Datapath.MaxPairs, "connections in setup at once")
	f.Uint32Var(&rc.cfg.Datapath.MaxUnread, "max-unread", 0, "bytes a connection's receiver may leave unread before the connection switches to the kernel path for good (0: the receiver's SO_RCVBUF if set, else min(tcp_rmem max, 4 MiB))")
	f.StringVar(&rc.readyFile, "ready-file", "", "file created once everything is attached (for scripts and tests)")
	f.DurationVar(&rc.pairAge, "pair-max-age", 60*time.Second, "age after which unclaimed or ambiguous pairing records are removed")
	rc.selection.register(f)
	f.StringVar(&rc.resetDevs, "close-reset-devices", "all", "devices that carry the RST on close (the tc program that turns an accelerated socket's FIN into the RST plain TCP sends): all (the node's loopback, bridges and every pod's veth, and the loopbacks of the managed pods) or covered (only those of the network namespaces where processes of the managed cgroups live, in Kubernetes mode of the selected pods: other pods' packets meet no eztunnel tc program; a socket enrols only once its namespace is covered, so a new pod's first connections, until the agent has attached there within about 100 ms, stay on the kernel path, counted as fallback uncovered)")
	f.StringVar(&rc.metrics, "metrics-addr", "", "serve Prometheus metrics on this host:port at /metrics (default off)")
	f.StringVar(&rc.health, "health-addr", "", "serve /healthz and /readyz on this host:port (default off)")
	f.BoolVar(&rc.takeover, "takeover", false, "if another agent runs, ask it to hand over (it stands by until stopped) instead of refusing")
	f.DurationVar(&rc.lockWait, "takeover-timeout", 60*time.Second, "how long to wait for the running agent to hand over the node's lock (with --takeover; as eztunnel uninstall --takeover-timeout)")
	f.BoolVar(&rc.adopt, "adopt", true, "adopt connections established before the agent (once ready, every --adopt-interval, and on eztunnel adopt) when that is provably safe")
	f.DurationVar(&rc.adoptIvl, "adopt-interval", 30*time.Second, "how often to look for connections to adopt (0: only once ready and on eztunnel adopt)")
	for _, o := range rc.cfg.FamilyOptions() {
		o.Register(f)
	}
	rc.kube.register(f)
	f.BoolVar(&rc.dryRun, "dry-run", false, "check the flags and how they combine, print the configuration the agent would run with (JSON) and exit; nothing on the node is read or changed")
	f.MarkHidden("ready-file")
	return cmd
}

func run(ctx context.Context, flags *pflag.FlagSet, rc runConfig) error {
	sel, err := rc.selection.parse()
	if err != nil {
		return err
	}
	rc.cfg.Datapath.Select = sel
	switch rc.resetDevs {
	case "all":
	case "covered":
		rc.cfg.Datapath.CoveredOnly = true
	default:
		return fmt.Errorf("--close-reset-devices %q: want all or covered", rc.resetDevs)
	}
	for _, o := range rc.cfg.FamilyOptions() {
		if err := o.Parse(flags); err != nil {
			return err
		}
	}
	if rc.lockFile == "" {
		rc.lockFile = rc.cfg.Datapath.Layout().Lock()
	}
	kc, err := rc.kube.parse(flags, rc.cfg.Services.On)
	if err != nil {
		return err
	}
	if rc.adoptIvl < 0 {
		return fmt.Errorf("--adopt-interval %s must not be negative", rc.adoptIvl)
	}
	if rc.dryRun {
		cfg := rc.agentConfig(kc)
		if err := agent.ValidateConfig(cfg); err != nil {
			return err
		}
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(cfg)
	}
	stopLevels := followLogLevel(rc.cfg.Datapath.Layout().LogLevel())
	defer stopLevels()
	agentlock.Signals = "SIGUSR1 SIGUSR2" // adoption (internal/agent), log level (followLogLevel)
	// The last MiB of the log, for `eztunnel bugreport` on the node. An
	// agent that stops before installing anything takes a new file away.
	logPath := rc.cfg.Datapath.Layout().Log()
	_, statErr := os.Stat(logPath)
	if tl, err := agentlog.Open(logPath, 1<<20); err != nil {
		slog.Warn("no log file for eztunnel bugreport", "err", err)
	} else {
		defer tl.Close()
		if err := cli.TeeLogs(tl); err != nil {
			return err
		}
	}
	err = agent.Run(ctx, rc.agentConfig(kc))
	if _, perr := os.Stat(rc.cfg.Datapath.Dir()); err != nil && os.IsNotExist(statErr) && os.IsNotExist(perr) {
		os.Remove(logPath)
	}
	return err
}

// agentConfig is the agent's configuration from the parsed flags.
func (rc runConfig) agentConfig(kc *agent.KubeConfig) agent.Config {
	cfg := rc.cfg
	cfg.Cgroups, cfg.ReadyFile = rc.cgroups, rc.readyFile
	cfg.MetricsAddr, cfg.HealthAddr, cfg.PairMaxAge, cfg.Version = rc.metrics, rc.health, rc.pairAge, version
	cfg.LockFile, cfg.Takeover, cfg.LockWait, cfg.Kubernetes = rc.lockFile, rc.takeover, rc.lockWait, kc
	cfg.Adopt, cfg.AdoptEvery = rc.adopt, rc.adoptIvl
	return cfg
}
