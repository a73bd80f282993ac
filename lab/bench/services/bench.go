// Package services is `eztunnel-lab bench services`: kube-proxy (iptables,
// nftables) and eztunnel's Service datapath from 1 to 10,000 Services, fed
// by a real etcd + kube-apiserver, on one lab node (lab/multinode) with an
// external client. The harness writes the Node, Services and
// EndpointSlices itself (no kubelet or controller-manager runs).
package services

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/eztunnel/eztunnel/internal/stats"
	"github.com/eztunnel/eztunnel/lab/bench"
	"github.com/eztunnel/eztunnel/lab/k8scluster"
	"github.com/eztunnel/eztunnel/lab/multinode"
	"github.com/eztunnel/eztunnel/lab/workload"
)

// Options of a run.
type Options struct {
	Exe, Agent string // eztunnel-lab and eztunnel
	BinDir     string // tools/kube/build.sh's output
	Counts     []int
	Datapaths  []string
	Connects   int  // connect-latency samples per datapath, count and family
	SyncN      int  // one-change sync samples per datapath and count
	DITG       DITG // D-ITG flows (N 0: none)
	Out        string
	Log        io.Writer
}

// QuickCounts and FullCounts are the Service counts of --quick and a full run.
var (
	QuickCounts = []int{1, 1000, 5000}
	FullCounts  = []int{1, 1000, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 9000, 10000}
)

// Host side of the veth the node's netns reaches the API server through.
const (
	apiHostIP   = "10.250.9.1"
	apiNodeIP   = "10.250.9.2"
	apiHostLink = "ezsvcapi"
	nBackends   = 4
	labName     = "svcb"
	runDir      = "/var/lib/eztunnel-svcbench"
)

// Step is one datapath at one Service count.
type Step struct {
	Count    int     `json:"count"`
	Datapath string  `json:"datapath"`
	Ready    float64 `json:"ready_seconds"` // start until the newest Service answers
	// Connect latency in µs by path: clusterip-v4, clusterip-v6, nodeport-v4, nodeport-v6.
	Latency map[string][]float64 `json:"latency_us"`
	Fails   map[string]int       `json:"failures"`
	// End-to-end one-change sync: API write to the first connect that
	// reaches the new port, ms.
	SyncE2E []float64 `json:"sync_e2e_ms"`
	// The datapath's own sync histograms over the sync samples: p50, p99 in ms.
	SyncMetric map[string][2]float64 `json:"sync_metric_ms"`
	// D-ITG by path: TCP throughput samples (Mbit/s per interval, pooled
	// over the flows) and UDP one-way delays (µs, every packet of every
	// flow); each flow's ITGDec totals; flows that failed.
	Throughput map[string][]float64 `json:"ditg_tcp_mbps"`
	UDPDelay   map[string][]float64 `json:"ditg_udp_delay_us"`
	Flows      []Flow               `json:"ditg_flows"`
	DITGFails  map[string]int       `json:"ditg_failures"`
	// eztunnel's tc NodePort program over each NodePort path's connect
	// probes (kernel BPF run-time statistics): ns per run (a packet of
	// the node's devices), and runs.
	NodePortProg map[string][2]float64 `json:"nodeport_prog,omitempty"`
}

// Result of a run.
type Result struct {
	Steps        []Step          `json:"steps"`
	CreateTimes  map[int]float64 `json:"create_seconds"` // Services created up to count: seconds for that batch
	NodePortEZ   bool            `json:"eztunnel_nodeport"`
	CPUPlacement string          `json:"cpu_placement"`
	DITG         DITG            `json:"ditg"`
	Load         []string        `json:"loadavg"` // /proc/loadavg at the start of each count
}

func (o Options) logf(f string, a ...any) {
	if o.Log != nil {
		fmt.Fprintf(o.Log, "bench services: "+f+"\n", a...)
	}
}

// Run runs the sweep and writes the report to w.
func Run(ctx context.Context, o Options, w io.Writer) (err error) {
	if len(o.Datapaths) == 0 {
		o.Datapaths = []string{IPTables, NFTables, Eztunnel}
	}
	tmp, err := os.MkdirTemp("", "ez-svcbench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	lab, err := multinode.New(multinode.Options{Name: labName, Nodes: 1, ForwardPolicy: "ACCEPT"})
	if err != nil {
		return err
	}
	defer lab.Close()
	node := lab.Nodes[0]
	if err := apiLink(node); err != nil {
		return err
	}
	cp, err := k8scluster.StartControlPlane(ctx, k8scluster.ControlPlaneConfig{BinDir: o.BinDir, RunDir: runDir,
		AdvertiseIP: apiHostIP, ServiceCIDRv6: "fd96::/108", Log: o.Log})
	if err != nil {
		return err
	}
	defer cp.Stop()
	rc, err := clientcmd.BuildConfigFromFlags("", cp.Kubeconfig)
	if err != nil {
		return err
	}
	rc.QPS, rc.Burst = 2000, 4000
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	if err := createNode(ctx, cs, node); err != nil {
		return err
	}
	wl := workload.Client{Exe: o.Exe}
	var backends []*multinode.Pod
	for i := range nBackends {
		p, err := node.AddPod(fmt.Sprintf("b%d", i), false)
		if err != nil {
			return err
		}
		srv, err := wl.Serve(ctx, p, tmp, "--stream", fmt.Sprintf("[::]:%d", targetPort))
		if err != nil {
			return err
		}
		defer srv.Stop()
		backends = append(backends, p)
	}
	client, err := node.AddPod("c", true)
	if err != nil {
		return err
	}
	nodePortEZ := NodePortFlag(ctx, o.Agent)
	if !nodePortEZ {
		fmt.Fprintln(w, "eztunnel NodePort: not supported by this build (no --nodeport in `eztunnel run --help`)")
		o.logf("eztunnel NodePort: not supported by this build")
	}
	res := Result{CreateTimes: map[int]float64{}, NodePortEZ: nodePortEZ, CPUPlacement: "unpinned: client, servers, datapath and API server share the VM's CPUs",
		DITG: o.DITG}
	var de *ditgEnv
	if o.DITG.N > 0 {
		// ITGRecv in the first backend pod, behind the D-ITG Service.
		de = &ditgEnv{recv: &receiver{pod: backends[0], dir: tmp}}
		defer de.recv.stop()
		if err := extRoutes(lab.External, node); err != nil {
			return err
		}
		if de.v4, de.v6, err = createDITG(ctx, cs, backends[0], node.Name); err != nil {
			return err
		}
		if err := de.recv.ensure(ctx); err != nil {
			return err
		}
	}
	v := &vips{}
	made := 0
	r := rand.New(rand.NewPCG(1, 2))
	for ci, count := range o.Counts {
		d, err := createServices(ctx, cs, made, count, backends, node.Name, v)
		if err != nil {
			return fmt.Errorf("creating Services %d..%d: %w", made, count, err)
		}
		res.CreateTimes[count] = d.Seconds()
		o.logf("%d Services (+%d, two EndpointSlices each) created in %.1fs", count, count-made, d.Seconds())
		made = count
		if la, err := os.ReadFile("/proc/loadavg"); err == nil {
			res.Load = append(res.Load, fmt.Sprintf("%d Services: %s", count, strings.TrimSpace(string(la))))
		}
		if ci == 0 {
			// No datapath yet: the VIPs must not answer, or the bench
			// would measure something other than translation.
			if err := unanswered(ctx, wl, client, lab.External, node, v, tmp); err != nil {
				return err
			}
		}
		// Interleaved: the datapath order alternates per count.
		order := append([]string(nil), o.Datapaths...)
		if ci%2 == 1 {
			for i, j := 0, len(order)-1; i < j; i, j = i+1, j-1 {
				order[i], order[j] = order[j], order[i]
			}
		}
		for _, dp := range order {
			st, err := runStep(ctx, o, wl, cs, cp, node, client, lab.External, backends, v, de, count, dp, tmp, nodePortEZ, r)
			if err != nil {
				return fmt.Errorf("%s at %d Services: %w", dp, count, err)
			}
			res.Steps = append(res.Steps, st)
		}
	}
	if o.Out != "" {
		if err := os.MkdirAll(o.Out, 0o755); err != nil {
			return err
		}
		b, _ := json.MarshalIndent(res, "", " ")
		if err := os.WriteFile(filepath.Join(o.Out, "services.json"), b, 0o644); err != nil {
			return err
		}
		if err := plots(res, o.Out); err != nil {
			return err
		}
		if err := ditgPlots(res, o.Out); err != nil {
			return err
		}
	}
	report(w, res, o.Datapaths)
	return nil
}

// apiLink: a veth from the host into the node's netns (removed with it);
// kube-proxy and the agent reach the API server at apiHostIP over it.
func apiLink(n *multinode.Node) error {
	fd, err := netns.GetFromPath("/run/netns/" + n.NetNS)
	if err != nil {
		return err
	}
	defer fd.Close()
	if old, err := netlink.LinkByName(apiHostLink); err == nil {
		netlink.LinkDel(old) // a killed run's, if its netns survived
	}
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: apiHostLink}, PeerName: "api0", PeerNamespace: netlink.NsFd(int(fd))}
	if err := netlink.LinkAdd(veth); err != nil {
		return fmt.Errorf("api veth: %w", err)
	}
	hl, err := netlink.LinkByName(apiHostLink)
	if err != nil {
		return err
	}
	a, _ := netlink.ParseAddr(apiHostIP + "/30")
	if err := netlink.AddrAdd(hl, a); err != nil {
		return err
	}
	if err := netlink.LinkSetUp(hl); err != nil {
		return err
	}
	h, err := n.Handle()
	if err != nil {
		return err
	}
	defer h.Close()
	nl, err := h.LinkByName("api0")
	if err != nil {
		return err
	}
	a, _ = netlink.ParseAddr(apiNodeIP + "/30")
	if err := h.AddrAdd(nl, a); err != nil {
		return err
	}
	return h.LinkSetUp(nl)
}

// runStep starts one datapath, waits until it serves the newest Service,
// measures, stops it and cleans the node.
func runStep(ctx context.Context, o Options, wl workload.Client, cs kubernetes.Interface, cp *k8scluster.Cluster,
	node *multinode.Node, client *multinode.Pod, ext *multinode.External, backends []*multinode.Pod, v *vips, de *ditgEnv,
	count int, dp, tmp string, nodePortEZ bool, r *rand.Rand) (st Step, err error) {
	st = Step{Count: count, Datapath: dp, Latency: map[string][]float64{}, Fails: map[string]int{}, SyncMetric: map[string][2]float64{},
		Throughput: map[string][]float64{}, UDPDelay: map[string][]float64{}, DITGFails: map[string]int{}}
	t0 := time.Now()
	var run *running
	switch dp {
	case IPTables, NFTables:
		run, err = startKubeProxy(ctx, o, node, dp, cp.PKIPath("kube-proxy.kubeconfig"), tmp)
	case Eztunnel:
		run, err = startAgent(ctx, o, node, cp.Kubeconfig, tmp, nodePortEZ)
	default:
		return st, fmt.Errorf("unknown datapath %q", dp)
	}
	if err != nil {
		return st, err
	}
	defer func() {
		if serr := run.stop(); serr != nil && err == nil {
			err = fmt.Errorf("stopping %s: %w", dp, serr)
		}
		// The datapath's whole log, kept (its timestamps show where a
		// slow start went).
		if o.Out != "" {
			dir := filepath.Join(o.Out, "logs")
			if merr := os.MkdirAll(dir, 0o755); merr == nil {
				os.WriteFile(filepath.Join(dir, fmt.Sprintf("%s-%d.log", dp, count)), run.logs.Bytes(), 0o644)
			}
		}
		if dp != Eztunnel {
			if cerr := cleanupKubeProxy(context.Background(), o, node); cerr != nil && err == nil {
				err = cerr
			}
		}
		if err != nil {
			err = fmt.Errorf("%w\n%s log tail:\n%s", err, dp, tailOf(run.logs.String(), 30))
		}
	}()
	started := time.Since(t0).Seconds()
	// Ready: the first and newest Services answer in both families.
	for _, a := range []string{v.v4[0], v.v6[0], v.v4[count-1], v.v6[count-1]} {
		if err := until(ctx, wl, client, a, false); err != nil {
			return st, fmt.Errorf("waiting for %s: %w", a, err)
		}
	}
	st.Ready = time.Since(t0).Seconds()
	o.logf("%s at %d Services: started after %.1fs (eztunnel: its ready file), serving after %.1fs", dp, count, started, st.Ready)

	targets := map[string][]string{"clusterip-v4": v.v4[:count], "clusterip-v6": v.v6[:count]}
	if dp != Eztunnel || nodePortEZ {
		np := min(count, MaxNodePorts)
		for _, fam := range []string{"v4", "v6"} {
			ip := node.UnderlayV4.String()
			if fam == "v6" {
				ip = "[" + node.UnderlayV6.String() + "]"
			}
			var ts []string
			for i := range np {
				ts = append(ts, ip+":"+strconv.Itoa(nodePort(i)))
			}
			targets["nodeport-"+fam] = ts
		}
	}
	for _, path := range []string{"clusterip-v4", "clusterip-v6", "nodeport-v4", "nodeport-v6"} {
		ts := targets[path]
		if ts == nil {
			continue
		}
		f := filepath.Join(tmp, path+".targets")
		if err := os.WriteFile(f, []byte(strings.Join(ts, "\n")), 0o644); err != nil {
			return st, err
		}
		var res workload.ConnectResult
		var p workload.Pod = client
		if strings.HasPrefix(path, "nodeport") {
			p = ext
		}
		// Statistics on for these probes only (each run of every BPF
		// program then costs two clock reads more).
		var prog0 bench.ProgStat
		var statsOn io.Closer
		if dp == Eztunnel && p == ext {
			if statsOn, err = bench.EnableProgStats(); err != nil {
				return st, err
			}
			if prog0, err = nodePortProgStats(); err != nil {
				statsOn.Close()
				return st, err
			}
		}
		_, err := wl.Workload(ctx, p, 5*time.Minute, &res, "connect", "--targets-file", f, "--n", strconv.Itoa(o.Connects),
			"--seed", strconv.Itoa(count))
		if err != nil {
			if statsOn != nil {
				statsOn.Close()
			}
			return st, fmt.Errorf("connect %s: %w", path, err)
		}
		if statsOn != nil {
			prog1, err := nodePortProgStats()
			statsOn.Close()
			if err != nil {
				return st, err
			}
			if d := prog1.Sub(prog0); d.Runs > 0 {
				runs := d.Runs
				if st.NodePortProg == nil {
					st.NodePortProg = map[string][2]float64{}
				}
				ns := d.NsPerRun()
				st.NodePortProg[path] = [2]float64{ns, float64(runs)}
				o.logf("eztunnel at %d Services: %s: NodePort program %.0f ns per run over %d runs", count, path, ns, runs)
			}
		}
		for _, ns := range res.Nanos {
			st.Latency[path] = append(st.Latency[path], float64(ns)/1e3)
		}
		st.Fails[path] = res.Failures
		if res.Failures > 0 {
			o.logf("%s %d %s: %d connects failed (%s)", dp, count, path, res.Failures, res.LastErr)
		}
	}

	if de != nil {
		if err := runDITG(ctx, o, wl, client, ext, node, backends[0], de, dp, nodePortEZ, tmp, &st); err != nil {
			return st, err
		}
	}

	// One-change sync: Service k's v4 slice to a closed port (wait until
	// refused), then back; the time from that write to the first connect
	// that gets through.
	before, err := scrape(node)
	if err != nil {
		return st, fmt.Errorf("metrics: %w", err)
	}
	for range o.SyncN {
		k := r.IntN(count)
		if err := setSlicePort(ctx, cs, k, false, backends, node.Name, closedPort); err != nil {
			return st, err
		}
		if err := until(ctx, wl, client, v.v4[k], true); err != nil {
			return st, fmt.Errorf("waiting for the closed port of %s: %w", v.v4[k], err)
		}
		// An idle datapath: kube-proxy's minSyncPeriod (1 s) would
		// otherwise hold back a change right after the previous sync.
		time.Sleep(1100 * time.Millisecond)
		ms, err := timedChange(ctx, wl, client, v.v4[k], func() error {
			return setSlicePort(ctx, cs, k, false, backends, node.Name, targetPort)
		})
		if err != nil {
			return st, err
		}
		st.SyncE2E = append(st.SyncE2E, ms)
	}
	after, err := scrape(node)
	if err != nil {
		return st, fmt.Errorf("metrics: %w", err)
	}
	for _, m := range syncMetrics[dp] {
		h := histOf(after, m).minus(histOf(before, m))
		st.SyncMetric[m] = [2]float64{h.quantile(0.5) * 1e3, h.quantile(0.99) * 1e3}
	}
	o.logf("%s at %d Services: connect v4 p50 %.0f µs, sync e2e p50 %.1f ms", dp, count,
		stats.Summarize(st.Latency["clusterip-v4"]).P50, stats.Summarize(st.SyncE2E).P50)
	return st, nil
}

// until waits (in the client pod) until a connect to addr connects, or is
// refused.
func until(ctx context.Context, wl workload.Client, p *multinode.Pod, addr string, refused bool) error {
	_, err := timedChange(ctx, wl, p, addr, nil, "--refused="+strconv.FormatBool(refused))
	return err
}

// timedChange starts connect-until in the pod, runs write (if any) and
// returns the ms from just before write to the first wanted outcome.
func timedChange(ctx context.Context, wl workload.Client, p *multinode.Pod, addr string, write func() error, extra ...string) (float64, error) {
	cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := p.Cmd(cctx, wl.Exe, append([]string{"workload", "connect-until", "--addr", addr}, extra...)...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return 0, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return 0, err
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := wl.Start(p, cmd); err != nil {
		return 0, err
	}
	defer cmd.Wait()
	buf := make([]byte, 64)
	var line []byte
	readLine := func() (string, error) {
		for {
			if i := strings.IndexByte(string(line), '\n'); i >= 0 {
				l := string(line[:i])
				line = line[i+1:]
				return l, nil
			}
			n, err := stdout.Read(buf)
			line = append(line, buf[:n]...)
			if err != nil {
				return "", fmt.Errorf("connect-until: %w: %s", err, stderr.String())
			}
		}
	}
	if l, err := readLine(); err != nil || l != "ready" {
		return 0, fmt.Errorf("connect-until not ready (%q): %v", l, err)
	}
	t0 := time.Now()
	if _, err := io.WriteString(stdin, "go\n"); err != nil {
		return 0, err
	}
	if write != nil {
		if err := write(); err != nil {
			return 0, err
		}
	}
	l, err := readLine()
	if err != nil {
		return 0, err
	}
	ns, err := strconv.ParseInt(strings.TrimSpace(l), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("connect-until printed %q", l)
	}
	return float64(time.Unix(0, ns).Sub(t0).Microseconds()) / 1e3, nil
}

func tailOf(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// unanswered checks that Service 0's ClusterIPs and NodePort do not
// connect while no datapath runs.
func unanswered(ctx context.Context, wl workload.Client, client *multinode.Pod, ext *multinode.External, node *multinode.Node, v *vips, tmp string) error {
	for _, c := range []struct {
		p      workload.Pod
		target string
	}{{client, v.v4[0]}, {client, v.v6[0]}, {ext, node.UnderlayV4.String() + ":" + strconv.Itoa(nodePort(0))}} {
		f := filepath.Join(tmp, "none.targets")
		if err := os.WriteFile(f, []byte(c.target), 0o644); err != nil {
			return err
		}
		var res workload.ConnectResult
		if _, err := wl.Workload(ctx, c.p, time.Minute, &res, "connect", "--targets-file", f, "--n", "3", "--timeout", "300ms"); err != nil {
			return err
		}
		if res.Failures != 3 {
			return fmt.Errorf("%s connects with no datapath running: the lab does not measure Service translation", c.target)
		}
	}
	return nil
}

// Merge reads the services.json of several runs (e.g. a sweep split into
// runs under 15 minutes), and writes one report and its plots: each
// count's datapaths still come from one run, interleaved there; different
// counts may come from different runs. A count in two runs is an error.
func Merge(files []string, out string, w io.Writer) error {
	var all Result
	all.CreateTimes = map[int]float64{}
	var dps []string
	seen := map[int]string{}
	for i, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		var r Result
		if err := json.Unmarshal(b, &r); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		if i == 0 {
			all.NodePortEZ, all.CPUPlacement, all.DITG = r.NodePortEZ, r.CPUPlacement, r.DITG
		} else if r.DITG != all.DITG {
			return fmt.Errorf("%s: D-ITG settings %+v differ from %s's %+v", f, r.DITG, files[0], all.DITG)
		}
		for _, c := range counts(r) {
			if prev, ok := seen[c]; ok {
				return fmt.Errorf("%d Services in both %s and %s", c, prev, f)
			}
			seen[c] = f
		}
		for _, s := range r.Steps {
			if !slices.Contains(dps, s.Datapath) {
				dps = append(dps, s.Datapath)
			}
		}
		all.Steps = append(all.Steps, r.Steps...)
		for c, t := range r.CreateTimes {
			all.CreateTimes[c] = t
		}
		for _, l := range r.Load {
			all.Load = append(all.Load, l+" ("+filepath.Base(filepath.Dir(f))+")")
		}
	}
	order := []string{}
	for _, dp := range []string{IPTables, NFTables, Eztunnel} {
		if slices.Contains(dps, dp) {
			order = append(order, dp)
		}
	}
	if out != "" {
		if err := os.MkdirAll(out, 0o755); err != nil {
			return err
		}
		b, _ := json.MarshalIndent(all, "", " ")
		if err := os.WriteFile(filepath.Join(out, "services.json"), b, 0o644); err != nil {
			return err
		}
		if err := plots(all, out); err != nil {
			return err
		}
		if err := ditgPlots(all, out); err != nil {
			return err
		}
	}
	report(w, all, order)
	return nil
}
