package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/eztunnel/eztunnel/internal/netprobe"
	"github.com/eztunnel/eztunnel/internal/stats"
	"github.com/eztunnel/eztunnel/lab/workload"
)

func workloadUDPCmd() *cobra.Command {
	var serve, addr, ready string
	var size, n int
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "udp",
		Short: "UDP echo server (--serve) or ping-pong client (--addr) with a known datagram count",
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case serve != "":
				ap, err := netip.ParseAddrPort(serve)
				if strings.HasPrefix(serve, ":") {
					// Every address of both families (an IPv6 socket
					// that takes IPv4 too, as net.ListenPacket's).
					ap, err = netip.ParseAddrPort("[::]" + serve)
				}
				if err != nil {
					return fmt.Errorf("--serve %q: want ip:port or :port", serve)
				}
				fd, _, err := netprobe.ListenUDP(ap)
				if err != nil {
					return err
				}
				if ready != "" {
					if err := os.WriteFile(ready, []byte("ready\n"), 0o644); err != nil {
						return err
					}
				}
				netprobe.Echo(fd, -1) // blocking, on a locked thread: until the process ends
				return nil
			case addr != "":
				got, rtts, err := workload.UDPPingPong(addr, size, n, timeout)
				if err != nil {
					return err
				}
				return json.NewEncoder(os.Stdout).Encode(workload.UDPResult{Sent: n, Echoed: got, Micros: stats.Summarize(stats.Micros(rtts))})
			}
			return errors.New("give --serve or --addr")
		},
	}
	f := cmd.Flags()
	f.StringVar(&serve, "serve", "", "echo datagrams on this address")
	f.StringVar(&addr, "addr", "", "echo server host:port")
	f.StringVar(&ready, "ready-file", "", "file written once listening")
	f.IntVar(&size, "size", 100, "datagram payload bytes")
	f.IntVar(&n, "n", 100, "datagrams")
	f.DurationVar(&timeout, "timeout", time.Second, "wait this long for each echo")
	return cmd
}

func workloadOrigProxyCmd() *cobra.Command {
	var addr string
	cmd := &cobra.Command{
		Use:   "origproxy",
		Short: "A sidecar behind an iptables REDIRECT: forwards each connection to its SO_ORIGINAL_DST (IPv4), a JSON line per connection on stdout",
		RunE: func(cmd *cobra.Command, _ []string) error {
			ln, err := net.Listen("tcp4", addr)
			if err != nil {
				return err
			}
			return workload.OrigProxy(ln, os.Stdout)
		},
	}
	cmd.Flags().StringVar(&addr, "addr", "0.0.0.0:15001", "listen address (IPv4)")
	return cmd
}
