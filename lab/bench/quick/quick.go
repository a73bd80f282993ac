// Package quick compares plain kernel TCP between two pods of a lab node
// with the same traffic through the eztunnel datapath (`eztunnel-lab bench
// quick`), and measures the agent's memory (`eztunnel-lab bench memory`).
package quick

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/eztunnel/eztunnel/internal/datapath"
	"github.com/eztunnel/eztunnel/internal/stats"
	"github.com/eztunnel/eztunnel/lab/bench"
)

// Lab and datapath placement of the quick benchmark. The pin root is its own
// so a datapath installed by `eztunnel run` is never touched.
const (
	labName   = "bench"
	labSubnet = 30
	PinRoot   = "/sys/fs/bpf/ezbench"
)

// Options of Quick.
type Options struct {
	// Rounds: alternations (quads) of an A/A pair of baseline phases and
	// an A/B pair (baseline, accelerated), each phase on fresh connections.
	Rounds        int       `json:"rounds"`
	RTTN          int       `json:"rtt_n"`          // recorded 24 B round trips; 64 KiB uses a tenth
	TransferBytes uint64    `json:"transfer_bytes"` // size of the flow-completion-time transfer
	CPU           int       `json:"cpu"`            // CPU client and server share; -1: no pinning
	MaxUnread     uint32    `json:"max_unread"`     // the agent's --max-unread; 0: its default bound
	Out           string    `json:"-"`              // directory for quick.json; empty: none
	Exe           string    `json:"-"`              // eztunnel binary run inside the pods
	Log           io.Writer `json:"-"`              // progress lines
}

// DefaultOptions are the flag defaults of `eztunnel bench quick`.
func DefaultOptions() Options {
	return Options{Rounds: 4, RTTN: 5000, TransferBytes: 256 << 20, CPU: 0}
}

func (o Options) validate() error {
	switch {
	case o.Rounds < 1:
		return fmt.Errorf("--rounds %d must be at least 1 (an interval needs 2)", o.Rounds)
	case o.RTTN < 10:
		return fmt.Errorf("--rtt-n %d must be at least 10", o.RTTN)
	case o.TransferBytes < 1:
		return errors.New("--transfer-bytes must be positive")
	case o.CPU < -1:
		return fmt.Errorf("--cpu %d: give a CPU number or -1", o.CPU)
	case o.Exe == "":
		return errors.New("no eztunnel binary to run in the pods")
	}
	return nil
}

// Measurement is what one mode measured in one round.
type Measurement struct {
	RTT24  stats.Summary `json:"rtt_24b_us"`
	RTT64K stats.Summary `json:"rtt_64kib_us"`
	FCT    float64       `json:"fct_s"`
	// TCPMemPeak: node TCP memory (/proc/net/sockstat, pages in bytes)
	// above its level before the transfer, at its highest during it.
	TCPMemPeak uint64 `json:"transfer_tcp_mem_peak_bytes"`
}

// Round is one alternation (quad) of four phases, each the three
// measurements on fresh connections: an A/A pair (baseline in both phases)
// and an A/B pair (baseline, accelerated), in bench.QuadOrder (round i is
// quad i): a linear drift, and what an install or uninstall leaves behind,
// fall on both sides of each pair alike. The unix floor opens each round.
type Round struct {
	Unix             stats.Summary     `json:"unix_rtt_24b_us"`
	AA               [2]Measurement    `json:"baseline_aa"`
	Baseline         Measurement       `json:"baseline"`
	Accelerated      Measurement       `json:"accelerated"`
	AcceleratedFirst bool              `json:"accelerated_first"` // the A/B pair's order
	Counters         datapath.Counters `json:"accelerated_counters_delta"`
}

// Results of a Quick run, as written to quick.json.
type Results struct {
	Options Options `json:"options"`
	Rounds  []Round `json:"rounds"`
}

// connsPerMode is how many TCP connections one mode's measurements open:
// each of them should become one accelerated pair.
const connsPerMode = 3

// Quick builds a lab of two managed pods and alternates baseline and
// accelerated phases in o.Rounds quads (see Round), then prints the
// table of paired comparisons to stdout. Everything it creates is removed on return, also when ctx is
// cancelled (Ctrl-C).
func Quick(ctx context.Context, o Options, stdout io.Writer) (err error) {
	if o.Log == nil {
		o.Log = io.Discard
	}
	if err := o.validate(); err != nil {
		return err
	}
	if err := bench.Preflight(); err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(datapath.DefaultPinRoot, datapath.Schema)); err == nil {
		fmt.Fprintf(o.Log, "warning: a datapath is installed at %s; if it manages an ancestor of the lab's cgroups, baseline numbers are accelerated too\n", datapath.DefaultPinRoot)
	}
	start := time.Now()
	cfg := datapath.DefaultConfig()
	cfg.PinRoot = PinRoot
	cfg.MaxUnread = o.MaxUnread
	if err := bench.Sweep(cfg, o.Log); err != nil {
		return fmt.Errorf("remove leftovers of an earlier run: %w", err)
	}

	r, err := newRunner(ctx, o)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := r.close(cfg); cerr != nil {
			err = errors.Join(err, fmt.Errorf("cleanup: %w", cerr))
		}
	}()

	res := Results{Options: o}
	for i := 0; i < o.Rounds; i++ {
		rd, err := r.round(cfg, i)
		if ctx.Err() != nil {
			return fmt.Errorf("interrupted: %w", ctx.Err())
		}
		if err != nil {
			return fmt.Errorf("round %d: %w", i+1, err)
		}
		res.Rounds = append(res.Rounds, rd)
	}

	rep := NewReport(res)
	if err := rep.Write(stdout); err != nil {
		return err
	}
	if o.Out != "" {
		if err := bench.WriteJSON(filepath.Join(o.Out, "quick.json"), res); err != nil {
			return err
		}
		fmt.Fprintf(o.Log, "results written to %s\n", filepath.Join(o.Out, "quick.json"))
	}
	fmt.Fprintf(o.Log, "bench quick took %s\n", time.Since(start).Round(time.Second))
	if !rep.Verified {
		return errors.New("the datapath did not pair every accelerated connection; accelerated numbers are not trustworthy")
	}
	return nil
}

// round measures one quad: the unix floor, then its four phases in the
// round's order, the datapath installed for the accelerated phase only.
func (r *runner) round(cfg datapath.Config, i int) (Round, error) {
	quad := bench.QuadOrder(i)
	rd := Round{AcceleratedFirst: quad[2] == bench.SideB}
	var err error
	tag := fmt.Sprintf("round %d/%d", i+1, r.o.Rounds)
	if rd.Unix, err = r.pingpong(r.unixAddr, 24, r.o.RTTN); err != nil {
		return rd, fmt.Errorf("unix floor: %w", err)
	}
	r.logf("%s unix floor: 24 B p50 %.1f us", tag, rd.Unix.P50)
	type phase struct {
		name string
		into *Measurement
	}
	phases := map[bench.Side]phase{bench.SideAA1: {"A/A baseline 1", &rd.AA[0]}, bench.SideAA2: {"A/A baseline 2", &rd.AA[1]},
		bench.SideA: {"baseline", &rd.Baseline}, bench.SideB: {"accelerated", &rd.Accelerated}}
	for _, side := range quad {
		ph := phases[side]
		if ph.into != &rd.Accelerated {
			if *ph.into, err = r.measure(tag + " " + ph.name); err != nil {
				return rd, err
			}
			continue
		}
		if rd.Accelerated, rd.Counters, err = r.accelerated(cfg, tag); err != nil {
			return rd, err
		}
	}
	return rd, nil
}

// accelerated installs the datapath, measures and uninstalls it; the
// counters are its deltas over the measurements.
func (r *runner) accelerated(cfg datapath.Config, tag string) (Measurement, datapath.Counters, error) {
	var m Measurement
	var delta datapath.Counters
	dp, err := datapath.Install(cfg, []string{r.lab.Managed})
	if err != nil {
		return m, nil, fmt.Errorf("install datapath: %w", err)
	}
	r.installed = true
	before, err := dp.Counters()
	if err == nil {
		m, err = r.measure(tag + " accelerated")
	}
	if err == nil {
		var after datapath.Counters
		if after, err = dp.Counters(); err == nil {
			delta = bench.Delta(before, after)
			r.logf("%s datapath: %d pairs, %d bytes redirected", tag, delta["pairs"], delta["bytes_redirected"])
		}
	}
	dp.Close()
	if err != nil {
		return m, nil, err
	}
	if err := datapath.Uninstall(cfg, bench.Drain); err != nil {
		return m, nil, fmt.Errorf("uninstall datapath: %w", err)
	}
	r.installed = false
	return m, delta, nil
}

// measure runs the three measurements of one mode on fresh connections.
func (r *runner) measure(tag string) (Measurement, error) {
	var m Measurement
	var err error
	if m.RTT24, err = r.pingpong(r.echoAddr, 24, r.o.RTTN); err != nil {
		return m, fmt.Errorf("%s: 24 B ping-pong: %w", tag, err)
	}
	if m.RTT64K, err = r.pingpong(r.echoAddr, 64<<10, max(r.o.RTTN/10, 10)); err != nil {
		return m, fmt.Errorf("%s: 64 KiB ping-pong: %w", tag, err)
	}
	if m.FCT, m.TCPMemPeak, err = r.transfer(r.o.TransferBytes); err != nil {
		return m, fmt.Errorf("%s: transfer: %w", tag, err)
	}
	r.logf("%s: RTT 24 B p50 %.1f us, 64 KiB p50 %.1f us, %s FCT %.2f s (node TCP memory +%.1f MiB)",
		tag, m.RTT24.P50, m.RTT64K.P50, sizeLabel(r.o.TransferBytes), m.FCT, float64(m.TCPMemPeak)/(1<<20))
	return m, nil
}
