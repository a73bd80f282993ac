package quick

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"

	"github.com/prometheus/procfs"

	"github.com/eztunnel/eztunnel/internal/datapath"
	"github.com/eztunnel/eztunnel/internal/stats"
	"github.com/eztunnel/eztunnel/lab/bench"
	"github.com/eztunnel/eztunnel/lab/netlab"
	"github.com/eztunnel/eztunnel/lab/workload"
)

// runner owns the lab, its long-running servers and the scratch directory.
type runner struct {
	ctx       context.Context
	o         Options
	lab       *netlab.Lab
	client    *netlab.Pod // a: every client, and the unix floor's server
	wl        workload.Client
	tmp       string
	servers   []*workload.Server
	installed bool // the datapath may be pinned under PinRoot

	echoAddr, streamAddr, unixAddr string
}

func newRunner(ctx context.Context, o Options) (_ *runner, err error) {
	r := &runner{ctx: ctx, o: o, wl: workload.Client{Exe: o.Exe}}
	if o.CPU >= 0 {
		r.wl.CPUs = []int{o.CPU}
	}
	defer func() {
		if err != nil {
			r.close(datapath.Config{})
		}
	}()
	if r.tmp, err = os.MkdirTemp("", "ezbench-"); err != nil {
		return nil, err
	}
	if r.lab, err = netlab.New(labName, labSubnet); err != nil {
		return nil, err
	}
	if r.client, err = r.lab.AddPod("a", true); err != nil {
		return nil, err
	}
	srv, err := r.lab.AddPod("b", true)
	if err != nil {
		return nil, err
	}
	r.echoAddr = net.JoinHostPort(srv.IPv4.String(), "7001")
	r.streamAddr = net.JoinHostPort(srv.IPv4.String(), "7000")
	r.unixAddr = "unix:" + filepath.Join(r.tmp, "echo.sock")
	r.logf("lab ready: client %s, server %s, CPU %s", r.client.IPv4, srv.IPv4, cpuLabel(o.CPU))
	for _, s := range []struct {
		pod  *netlab.Pod
		args []string
	}{{srv, []string{"--stream", ":7000", "--echo", ":7001"}}, {r.client, []string{"--echo", r.unixAddr}}} {
		sv, err := r.wl.Serve(ctx, s.pod, r.tmp, s.args...)
		if err != nil {
			return nil, err
		}
		r.servers = append(r.servers, sv)
	}
	return r, nil
}

// close stops the servers, removes the lab and, if still pinned, the
// datapath. A zero cfg skips the datapath.
func (r *runner) close(cfg datapath.Config) error {
	var errs []error
	for _, s := range r.servers {
		s.Stop()
	}
	if r.lab != nil {
		errs = append(errs, r.lab.Close())
	}
	if cfg.PinRoot != "" {
		if _, err := os.Stat(cfg.Dir()); err == nil {
			// The lab's processes are gone, so no socket is left to drain.
			errs = append(errs, datapath.Uninstall(cfg, bench.Drain))
		}
	}
	if r.tmp != "" {
		errs = append(errs, os.RemoveAll(r.tmp))
	}
	return errors.Join(errs...)
}

func (r *runner) logf(format string, args ...any) {
	fmt.Fprintf(r.o.Log, format+"\n", args...)
}

// pingpong measures n round trips of size-byte messages on one fresh
// connection, after n/20 unrecorded ones.
func (r *runner) pingpong(addr string, size, n int) (stats.Summary, error) {
	res, _, err := r.wl.PingPong(r.ctx, r.client, workload.PingPongArgs{Addr: addr, Size: size, N: n, Warmup: max(n/20, 10)})
	return res.Micros, err
}

// transfer sends n bytes client -> server on one fresh connection and
// returns the seconds from connect until the server confirmed the last byte,
// as the client measured them. Bytes are not generated or checked here
// (the e2e tests prove byte-exactness): that work would dominate the time.
// transfer uploads n bytes and returns its completion time and the peak of
// node TCP memory above its level before (bench.SockMemPeak): what the
// receiver holds unread, on the kernel path or the shortcut's.
func (r *runner) transfer(n uint64) (float64, uint64, error) {
	pfs, err := procfs.NewDefaultFS()
	if err != nil {
		return 0, 0, err
	}
	stopPeak, err := bench.SockMemPeak(pfs)
	if err != nil {
		return 0, 0, err
	}
	s, _, err := r.wl.Upload(r.ctx, r.client, r.streamAddr, n, 262144)
	return s, stopPeak(), err
}

func cpuLabel(cpu int) string {
	if cpu < 0 {
		return "unpinned"
	}
	return strconv.Itoa(cpu)
}
