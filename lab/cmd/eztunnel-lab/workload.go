package main

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/eztunnel/eztunnel/internal/stats"
	"github.com/eztunnel/eztunnel/lab/workload"
)

// workloadCmd groups the traffic generators that tests and benchmarks start
// inside lab pods. Hidden: they are tools of the lab, not of the agent.
func workloadCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "workload", Short: "Traffic generators for tests and benchmarks", Hidden: true}
	cmds := []*cobra.Command{workloadServeCmd(), workloadPeerCmd(), workloadStreamCmd(), workloadPingPongCmd(), workloadHoldCmd(), workloadUDPCmd(), workloadEarlyCmd(), workloadOrigProxyCmd()}
	for _, more := range [][]*cobra.Command{workloadProbeCmds(), workloadStuckCmds(), workloadPoolCmds(), workloadConnectCmds(), workloadHalfCloseCmds(), workloadTenantCmds(), workloadScaleCmds(), {workloadFionreadFirstCmd(), workloadHTTPPhasesCmd(), workloadEchoPhasesCmd()}} {
		cmds = append(cmds, more...)
	}
	cmd.AddCommand(cmds...)
	return cmd
}

// listenAddr splits "unix:/path" from TCP addresses.
func listen(addr string) (net.Listener, error) {
	if p, ok := strings.CutPrefix(addr, "unix:"); ok {
		os.Remove(p)
		return net.Listen("unix", p)
	}
	return net.Listen("tcp", addr)
}

func dial(addr string) (net.Conn, error) {
	if p, ok := strings.CutPrefix(addr, "unix:"); ok {
		return net.Dial("unix", p)
	}
	return net.Dial("tcp", addr)
}

func workloadServeCmd() *cobra.Command {
	var streams, echos, pools, poolsBlocking, peers, peersUDP []string
	var ready, name string
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve stream and echo clients until killed",
		RunE: func(cmd *cobra.Command, _ []string) error {
			var lns []net.Listener
			serve := func(addrs []string, fn func(net.Listener) error) error {
				for _, a := range addrs {
					ln, err := listen(a)
					if err != nil {
						return err
					}
					lns = append(lns, ln)
					go fn(ln)
				}
				return nil
			}
			if err := serve(streams, workload.ServeStream); err != nil {
				return err
			}
			if err := serve(pools, workload.ServePool); err != nil {
				return err
			}
			for _, a := range echos {
				fd, err := workload.RawListen(a)
				if err != nil {
					return err
				}
				go workload.ServeEcho(fd)
			}
			for _, a := range poolsBlocking {
				fd, err := workload.RawListen(a)
				if err != nil {
					return err
				}
				go workload.ServePoolBlocking(fd)
			}
			for _, a := range peers {
				ln, err := net.Listen("tcp", a)
				if err != nil {
					return err
				}
				go workload.ServePeer(ln, name)
			}
			for _, a := range peersUDP {
				pc, err := net.ListenPacket("udp", a)
				if err != nil {
					return err
				}
				go workload.ServePeerUDP(pc, name)
			}
			if len(lns)+len(echos)+len(poolsBlocking)+len(peers)+len(peersUDP) == 0 {
				return fmt.Errorf("nothing to serve: give --stream, --echo, --pool or --pool-blocking")
			}
			if ready != "" {
				if err := os.WriteFile(ready, []byte("ready\n"), 0o644); err != nil {
					return err
				}
			}
			select {}
		},
	}
	cmd.Flags().StringSliceVar(&streams, "stream", nil, "listen address(es) for stream clients")
	cmd.Flags().StringSliceVar(&echos, "echo", nil, "listen address(es) for ping-pong clients (unix:/path for a unix socket)")
	cmd.Flags().StringSliceVar(&pools, "pool", nil, "listen address(es) for pool clients: echo every byte, non-blocking sockets and epoll (Go's netpoller)")
	cmd.Flags().StringSliceVar(&poolsBlocking, "pool-blocking", nil, "the same with a thread per connection blocked in read(2), as thread-per-connection servers do")
	cmd.Flags().StringSliceVar(&peers, "peer", nil, "listen address(es) for peer clients (TCP): each connection is answered with --name, the client address seen and the sha256 of what it sent")
	cmd.Flags().StringSliceVar(&peersUDP, "peer-udp", nil, "the same over UDP: each datagram comes back with --name and the client address seen")
	cmd.Flags().StringVar(&name, "name", "", "this server's name in --peer answers (a pod's name)")
	cmd.Flags().StringVar(&ready, "ready-file", "", "file written once listening")
	return cmd
}

// workloadPeerCmd: who answers at an address (a Service): TCP connections
// or UDP datagrams to --peer / --peer-udp servers, one JSON answer each.
func workloadPeerCmd() *cobra.Command {
	var addr string
	var n, size int
	var udp bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "peer",
		Short: "Connections (or datagrams) to peer servers; prints which server answered each and the client address it saw (JSON)",
		RunE: func(cmd *cobra.Command, _ []string) error {
			var as []workload.PeerAnswer
			if udp {
				as = workload.PeerUDP(addr, n, size, timeout)
			} else {
				as = workload.PeerTCP(addr, n, size, timeout)
			}
			return json.NewEncoder(os.Stdout).Encode(as)
		},
	}
	f := cmd.Flags()
	f.StringVar(&addr, "addr", "", "host:port")
	f.IntVar(&n, "n", 10, "connections (or datagrams, on one socket)")
	f.IntVar(&size, "size", 65536, "bytes sent per connection (datagram size, at least 9, with --udp)")
	f.BoolVar(&udp, "udp", false, "datagrams on one connected UDP socket")
	f.DurationVar(&timeout, "timeout", 2*time.Second, "connect (or answer) timeout")
	return cmd
}

func workloadStreamCmd() *cobra.Command {
	var o workload.StreamOptions
	cmd := &cobra.Command{
		Use:   "stream",
		Short: "Byte-exact streams in both directions; exits 1 on any mismatch",
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.Conns < 1 {
				return fmt.Errorf("--conns %d must be at least 1", o.Conns)
			}
			start := time.Now()
			fails := workload.RunStreams(o)
			json.NewEncoder(os.Stdout).Encode(workload.StreamReport{Conns: o.Conns, Failures: fails, Seconds: time.Since(start).Seconds()})
			if len(fails) > 0 {
				return fmt.Errorf("%d of %d connections failed; first: %s", len(fails), o.Conns, fails[0].Error)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Addr, "addr", "", "server address host:port")
	f.IntVar(&o.Conns, "conns", 1, "connections")
	f.IntVar(&o.Parallel, "parallel", 0, "connections at once (default all)")
	f.Uint64Var(&o.Up, "up", 1<<20, "bytes client -> server per connection")
	f.Uint64Var(&o.Down, "down", 1<<20, "bytes server -> client per connection")
	f.Uint32Var(&o.Chunk, "chunk", 64<<10, "write size in bytes")
	f.Uint64Var(&o.Seed, "seed", 1, "stream seed")
	f.BoolVar(&o.NoCheck, "no-check", false, "throughput only: repeat one buffer, discard what arrives")
	f.BoolVar(&o.Handshake, "handshake", false, "a request/response before the streams, as real protocols open (each side has read all its peer sent when its stream starts)")
	f.BoolVar(&o.Duplex, "duplex", false, "read the downstream while writing the upstream (default: after it)")
	f.DurationVar(&o.Pause, "pause", 0, "idle this long halfway through the upstream (a keep-alive connection)")
	f.StringVar(&o.ResumeFile, "resume-file", "", "with --pause: resume as soon as this file exists (--pause bounds the wait)")
	f.StringVar(&o.Bind, "bind", "", "local ip:port of every connection (SO_REUSEADDR+SO_REUSEPORT)")
	return cmd
}

func workloadPingPongCmd() *cobra.Command {
	var addr string
	var size, n, warmup, conns int
	var raw, sequential, phases bool
	var interval time.Duration
	var warmUntil string
	cmd := &cobra.Command{
		Use:   "pingpong",
		Short: "Round-trip times of size-byte messages echoed back",
		RunE: func(cmd *cobra.Command, _ []string) error {
			if phases {
				return workload.PingPongPhases(os.Stdin, os.Stdout, addr, size, n, warmup)
			}
			var mu sync.Mutex
			var all []float64
			var wg sync.WaitGroup
			errs := make(chan error, conns)
			for i := 0; i < conns; i++ {
				wg.Add(1)
				one := func() {
					defer wg.Done()
					fd, err := workload.RawDial(addr)
					if err != nil {
						errs <- err
						return
					}
					defer unix.Close(fd)
					var rtts []time.Duration
					var until func() bool
					if warmUntil != "" {
						until = func() bool { _, err := os.Stat(warmUntil); return err == nil }
					}
					rtts, err = workload.PingPongUntil(fd, size, n, warmup, interval, until)
					if err != nil {
						errs <- err
						return
					}
					mu.Lock()
					all = append(all, stats.Micros(rtts)...)
					mu.Unlock()
				}
				if sequential {
					one()
				} else {
					go one()
				}
			}
			wg.Wait()
			close(errs)
			if err := <-errs; err != nil {
				return err
			}
			res := workload.PingPongResult{Size: size, Micros: stats.Summarize(all), SpuriousEAGAIN: workload.SpuriousEAGAIN.Load()}
			if raw {
				res.Samples = all
			}
			return json.NewEncoder(os.Stdout).Encode(res)
		},
	}
	f := cmd.Flags()
	f.StringVar(&addr, "addr", "", "echo server host:port or unix:/path")
	f.IntVar(&size, "size", 24, "message size in bytes (at least 8)")
	f.IntVar(&n, "n", 10000, "recorded round trips per connection")
	f.IntVar(&warmup, "warmup", 500, "unrecorded round trips first")
	f.IntVar(&conns, "conns", 1, "connections, in parallel unless --sequential")
	f.BoolVar(&sequential, "sequential", false, "one connection after the other (each with its own warm-up)")
	f.BoolVar(&raw, "raw", false, "include every sample")
	f.DurationVar(&interval, "interval", 0, "send one message per interval instead of back-to-back (e.g. 100ms)")
	f.StringVar(&warmUntil, "warmup-until", "", "go on with the warm-up (at least --warmup round trips) until this file exists")
	f.BoolVar(&phases, "phases", false, "for each line read on stdin, one phase on a fresh connection (warm-up and --n round trips), its result and CPU time a JSON line on stdout; until stdin closes")
	return cmd
}

func workloadHoldCmd() *cobra.Command {
	var addr, ready string
	var conns, parallel int
	cmd := &cobra.Command{
		Use:   "hold",
		Short: "Open connections to a stream server, send one byte on each, keep them idle until killed",
		RunE: func(cmd *cobra.Command, _ []string) error {
			if conns < 1 {
				return fmt.Errorf("--conns %d must be at least 1", conns)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return workload.Hold(ctx, addr, conns, parallel, func() {
				if ready != "" {
					os.WriteFile(ready, []byte("ready\n"), 0o644)
				}
			})
		},
	}
	cmd.Flags().StringVar(&addr, "addr", "", "stream server host:port")
	cmd.Flags().IntVar(&conns, "conns", 10000, "connections to hold")
	cmd.Flags().IntVar(&parallel, "parallel", 64, "connects at once")
	cmd.Flags().StringVar(&ready, "ready-file", "", "file written once every connection is open")
	return cmd
}

// workloadStuckCmds: servers whose readers stop (or crawl) and the clients
// that fill them, for the backpressure tests.
func workloadStuckCmds() []*cobra.Command {
	var srv workload.StuckServerConfig
	var addr, ready string
	server := &cobra.Command{
		Use:   "stuck-server",
		Short: "Accept and read nothing until --go-file exists (or read at --rate), then check the stream",
		RunE: func(cmd *cobra.Command, _ []string) error {
			ln, err := workload.ListenStuck(addr, srv.Rcvbuf)
			if err != nil {
				return err
			}
			if ready != "" {
				if err := os.WriteFile(ready, []byte("ready\n"), 0o644); err != nil {
					return err
				}
			}
			return workload.ServeStuck(ln, srv)
		},
	}
	server.Flags().StringVar(&addr, "addr", ":7200", "listen address")
	server.Flags().StringVar(&ready, "ready-file", "", "file created once listening")
	server.Flags().StringVar(&srv.GoFile, "go-file", "", "readers start when this file exists")
	server.Flags().IntVar(&srv.Rate, "rate", 0, "read at most this many bytes/s per connection (0: unlimited)")
	server.Flags().IntVar(&srv.Rcvbuf, "rcvbuf", 0, "SO_RCVBUF of the listener (0: autotuning)")

	var cli workload.StuckClientConfig
	client := &cobra.Command{
		Use:   "stuck-client",
		Short: "Write --bytes of a checked stream on each of --conns connections with blocking writes",
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cli.Conns < 1 || cli.Bytes < 1 || cli.Chunk < 1 {
				return fmt.Errorf("--conns, --bytes and --chunk must be positive")
			}
			return workload.StuckClient(cli)
		},
	}
	client.Flags().StringVar(&cli.Addr, "addr", "", "server address")
	client.Flags().IntVar(&cli.Conns, "conns", 1, "connections")
	client.Flags().IntVar(&cli.Bytes, "bytes", 64<<20, "bytes per connection")
	client.Flags().IntVar(&cli.Chunk, "chunk", 1<<20, "bytes per write")
	client.Flags().IntVar(&cli.Sndbuf, "sndbuf", 0, "SO_SNDBUF (0: autotuning)")
	return []*cobra.Command{server, client}
}
