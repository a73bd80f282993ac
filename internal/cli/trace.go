package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/cilium/ebpf/rlimit"
	"github.com/spf13/cobra"

	"github.com/eztunnel/eztunnel/internal/tracer"
)

// traceOptions are the flags of `eztunnel trace`.
type traceOptions struct {
	cfg      tracer.Config
	host     string
	ifaces   []string
	duration time.Duration
	csv      string
	plot     string
	live     bool
	output   string
	ready    string
	plotter  PlotFunc
}

// PlotFunc draws a trace's CDF plots to base.svg and base.png. The agent
// binary passes none (no plotting library in the agent image); the lab does.
type PlotFunc func(rep *tracer.Report, base, title string) error

// TraceCmd is `trace`. With plot nil it has no --plot flag.
func TraceCmd(plot PlotFunc) *cobra.Command {
	o := traceOptions{cfg: tracer.DefaultConfig(), plotter: plot}
	cmd := &cobra.Command{
		Use:   "trace",
		Short: "Follow packets through the kernel: per-stage latency and jitter (needs root)",
		Long: "Follow each packet through the kernel stack with tracepoints, tcx observers and netfilter links,\n" +
			"and report per-stage latency percentiles and PDV (P99 - P1). Filters are applied in the kernel.\n" +
			"See docs/tracing.md.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := CheckOutput(o.output); err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			if o.duration > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, o.duration)
				defer cancel()
			}
			return runTrace(ctx, o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.host, "host", "", "only packets from or to this address")
	f.Uint16Var(&o.cfg.Filter.Port, "port", 0, "only packets from or to this port")
	f.Uint16Var(&o.cfg.Filter.SrcPort, "sport", 0, "only packets from this port")
	f.Uint16Var(&o.cfg.Filter.DstPort, "dport", 0, "only packets to this port")
	f.StringVar(&o.cfg.Filter.Proto, "proto", "", "only tcp or udp")
	f.IntVar(&o.cfg.Filter.Family, "family", 0, "only IPv4 (4) or IPv6 (6)")
	f.Uint32Var(&o.cfg.Filter.Ifindex, "ifindex", 0, "only packets whose lifetime starts on this interface index")
	f.StringVar(&o.cfg.Filter.NetNS, "filter-netns", "", "only packets whose lifetime starts in this netns (name under /run/netns)")
	f.StringSliceVar(&o.ifaces, "tcx", nil, "attach tcx observers first and last on IFACE or NETNS:IFACE (repeatable)")
	f.StringSliceVar(&o.cfg.NetNS, "netns", o.cfg.NetNS, "time the netfilter chains of these netns (names; \"\" is the tracer's own)")
	f.StringSliceVar(&o.cfg.HostNetNS, "host-netns", nil, "more host-side netns (nodes; names), besides the tracer's own: a packet's stages in a second host netns are h2_ (at most 4)")
	f.StringSliceVar(&o.cfg.WireNetNS, "wire-netns", nil, "netns not traced at all, e.g. a lab's underlay switch (names; at most 2)")
	f.Uint32Var(&o.cfg.TableSize, "table-size", o.cfg.TableSize, "packet lifetimes tracked at once")
	f.Uint32Var(&o.cfg.RingSize, "ringbuf-size", o.cfg.RingSize, "ring buffer bytes (power of two)")
	f.DurationVar(&o.cfg.MaxAge, "max-age", o.cfg.MaxAge, "a lifetime idle this long is over (evicted)")
	f.BoolVar(&o.cfg.RawTP, "raw-tp", false, "use raw_tp instead of tp_btf tracepoints")
	f.DurationVar(&o.duration, "duration", 0, "stop after this long (default: Ctrl-C)")
	f.StringVar(&o.csv, "csv", "", "write one row per packet to this file")
	if plot != nil {
		f.StringVar(&o.plot, "plot", "", "write CDF plots to PATH.svg and PATH.png")
	}
	f.BoolVar(&o.live, "live", false, "redraw a latency histogram every second")
	f.StringVar(&o.ready, "ready-file", "", "file written once everything is attached")
	f.MarkHidden("ready-file")
	OutputFlag(cmd, &o.output)
	return cmd
}

// TraceSummary is what `eztunnel trace -o json` prints.
type TraceSummary struct {
	Counters tracer.Counters `json:"counters"`
	Packets  int             `json:"packets"`
	ByEnd    map[string]int  `json:"by_end"`
	Stages   []tracer.Row    `json:"stages"`
	// Paths groups the packets by the stages they went through, each with
	// the stages it saved against the longest path.
	Paths []tracer.Path `json:"paths"`
}

func runTrace(ctx context.Context, o traceOptions) (err error) {
	if o.host != "" {
		a, err := netip.ParseAddr(o.host)
		if err != nil {
			return fmt.Errorf("--host: %w", err)
		}
		o.cfg.Filter.Host = a
	}
	for _, s := range o.ifaces {
		ifc, err := tracer.ParseIface(s)
		if err != nil {
			return err
		}
		o.cfg.Interfaces = append(o.cfg.Interfaces, ifc)
	}
	if err := rlimit.RemoveMemlock(); err != nil {
		return fmt.Errorf("remove memlock limit: %w", err)
	}
	t, err := tracer.Open(o.cfg)
	if err != nil {
		return err
	}
	defer t.Close()
	var csvw *tracer.CSVWriter
	if o.csv != "" {
		fh, err := os.Create(o.csv)
		if err != nil {
			return err
		}
		// A truncated CSV must not exit 0: flush and close errors are returned.
		bw := bufio.NewWriterSize(fh, 1<<20)
		defer func() {
			err = errors.Join(err, bw.Flush(), fh.Close())
		}()
		if csvw, err = tracer.NewCSVWriter(bw); err != nil {
			return err
		}
	}
	if o.ready != "" {
		if err := os.WriteFile(o.ready, []byte("attached\n"), 0o644); err != nil {
			return err
		}
	}
	fmt.Fprintf(os.Stderr, "tracing: %d programs attached; Ctrl-C to stop\n", len(t.Attached))

	rep := tracer.NewReport()
	var mu sync.Mutex
	var hist tracer.Histogram
	var csvErr error
	stopLive := startLive(o.live, &mu, &hist, t)
	err = t.Run(ctx, func(r tracer.Record) {
		mu.Lock()
		defer mu.Unlock()
		rep.Add(&r)
		hist.Add(r.Total())
		if csvw != nil && csvErr == nil {
			csvErr = csvw.Write(&r)
		}
	})
	stopLive()
	if err != nil {
		return err
	}
	c, err := t.Counters()
	if err != nil {
		return err
	}
	if csvw != nil {
		if err := csvw.Flush(); err != nil || csvErr != nil {
			return fmt.Errorf("write %s: %v %v", o.csv, err, csvErr)
		}
	}
	if o.plot != "" {
		if err := os.MkdirAll(filepath.Dir(o.plot), 0o755); err != nil {
			return err
		}
		if err := o.plotter(rep, o.plot, "eztunnel trace: per-packet latency"); err != nil {
			return err
		}
	}
	if o.output == "json" {
		s := TraceSummary{Counters: c, Packets: rep.Packets, ByEnd: map[string]int{}, Stages: rep.Rows(), Paths: rep.Paths()}
		for e, n := range rep.ByEnd {
			s.ByEnd[e.String()] = n
		}
		return json.NewEncoder(os.Stdout).Encode(s)
	}
	fmt.Printf("packets %d  started %d  lost %d (ring buffer full %d, table full %d)  reused %d  aged %d  evicted %d  open at stop %d\n",
		rep.Packets, c.Started, c.Lost(), c.RingDrops, c.TableFull, c.Reused, c.Aged, c.Evicted, c.Open)
	fmt.Printf("socket calls of matching flows: %d sendmsg (%d B), %d recvmsg (%d B)\n", c.SockSend, c.SockSendB, c.SockRecv, c.SockRecvB)
	return rep.Write(os.Stdout)
}

// startLive redraws the histogram of the last second until stopped.
func startLive(on bool, mu *sync.Mutex, hist *tracer.Histogram, t *tracer.Tracer) func() {
	if !on {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			mu.Lock()
			h := *hist
			*hist = tracer.Histogram{}
			mu.Unlock()
			c, _ := t.Counters()
			fmt.Fprint(os.Stderr, "\033[H\033[2J")
			h.Render(os.Stderr, "per-packet total latency, last second", 50)
			fmt.Fprintf(os.Stderr, "lost %d (ring %d, table %d)  evicted %d\n", c.Lost(), c.RingDrops, c.TableFull, c.Evicted)
		}
	}()
	return func() { close(done); wg.Wait() }
}
