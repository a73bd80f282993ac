package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/eztunnel/eztunnel/lab/bench/services"
)

func benchServicesCmd() *cobra.Command {
	o := services.Options{Connects: 2000, SyncN: 10, DITG: services.DefaultDITG}
	var quick bool
	var merge []string
	cmd := &cobra.Command{
		Use:   "services",
		Short: "kube-proxy iptables and nftables vs eztunnel --services from 1 to 10,000 Services, on a real etcd + kube-apiserver (needs root)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(merge) > 0 {
				return services.Merge(merge, o.Out, os.Stdout)
			}
			if o.BinDir == "" {
				return errors.New("--k8s-bin is required: the directory tools/kube/build.sh prints (make k8s-bin)")
			}
			if len(o.Counts) == 0 {
				o.Counts = services.FullCounts
				if quick {
					o.Counts = services.QuickCounts
				}
			}
			return withSelf(cmd, func(ctx context.Context, exe string) error {
				o.Exe, o.Log = exe, os.Stderr
				if o.Agent == "" {
					o.Agent = filepath.Join(filepath.Dir(exe), "eztunnel")
				}
				return services.Run(ctx, o, os.Stdout)
			})
		},
	}
	f := cmd.Flags()
	f.BoolVar(&quick, "quick", false, "1, 1000 and 5000 Services (default: 1, 1000, 2000, ..., 10000)")
	f.IntSliceVar(&o.Counts, "counts", nil, "Service counts, ascending (overrides --quick)")
	f.StringSliceVar(&o.Datapaths, "datapaths", nil, "datapaths: iptables, nftables, eztunnel (default all)")
	f.StringVar(&o.BinDir, "k8s-bin", "", "directory with kube-apiserver, kube-proxy, kubectl (tools/kube/build.sh)")
	f.StringVar(&o.Agent, "agent", "", "the eztunnel agent binary (default: eztunnel next to this binary)")
	f.IntVar(&o.Connects, "connects", o.Connects, "connect-latency samples per datapath, count and path")
	f.IntVar(&o.SyncN, "sync-n", o.SyncN, "one-change sync samples per datapath and count")
	f.StringVar(&o.Out, "out", "", "directory for services.json and the plots")
	f.StringSliceVar(&merge, "merge", nil, "no run: merge these runs' services.json files (disjoint counts) into one report and plots in --out")
	f.IntVar(&o.DITG.N, "ditg-n", o.DITG.N, "D-ITG flows per datapath, count, path and protocol (0: no D-ITG)")
	f.DurationVar(&o.DITG.Duration, "ditg-duration", o.DITG.Duration, "length of each D-ITG flow (the paper: 30s)")
	f.IntVar(&o.DITG.TCPSize, "ditg-tcp-size", o.DITG.TCPSize, "D-ITG TCP throughput flow: packet size, bytes")
	f.IntVar(&o.DITG.TCPRate, "ditg-tcp-rate", o.DITG.TCPRate, "D-ITG TCP throughput flow: offered packets/s")
	f.IntVar(&o.DITG.UDPSize, "ditg-udp-size", o.DITG.UDPSize, "D-ITG UDP latency flow: packet size, bytes")
	f.IntVar(&o.DITG.UDPRate, "ditg-udp-rate", o.DITG.UDPRate, "D-ITG UDP latency flow: packets/s")
	f.DurationVar(&o.DITG.Interval, "ditg-interval", o.DITG.Interval, "D-ITG TCP throughput sample interval (ITGDec -b)")
	return cmd
}
