package services

// D-ITG flows, as the slicing paper measured (ebpf-vs-iptables-slicing,
// Section VI): TCP throughput and UDP latency through a NodePort from the
// external client and, beyond the paper, from a pod to a ClusterIP.
//
// D-ITG's sender tells the receiver over its signaling channel which port
// to open, so the data port must be the same on the Service, the NodePort
// and the pod (the paper's workaround). The bench's own Services use
// 30000..32766 as NodePorts; the D-ITG Service takes the range's last port,
// 32767, for TCP and UDP (port = targetPort = nodePort). Signaling goes to
// the receiver pod directly (its port is never translated); only the data
// flow crosses the datapath under test.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/eztunnel/eztunnel/internal/sysexec"
	"github.com/eztunnel/eztunnel/lab/logbuf"
	"github.com/eztunnel/eztunnel/lab/multinode"
	"github.com/eztunnel/eztunnel/lab/workload"
)

const (
	ditgSvc     = "ditg"
	ditgPort    = 32767 // Service port = targetPort = nodePort, TCP and UDP
	ditgSigPort = 9000  // ITGRecv's signaling port, reached directly
)

// DITG is the D-ITG part of a run: N flows of Duration per datapath,
// Service count, path and protocol.
type DITG struct {
	N        int
	Duration time.Duration
	// TCP throughput flow: constant packet size (bytes) and rate (pkts/s);
	// the rate is above what the sender reaches here, so the flow's
	// bitrate is what the path carried.
	TCPSize, TCPRate int
	// UDP latency flow: D-ITG's defaults (512 bytes, 1000 pkts/s).
	UDPSize, UDPRate int
	// Interval of the TCP throughput samples (ITGDec -b).
	Interval time.Duration
}

// DefaultDITG: the paper ran 100 flows of 30 s per point; scaled down.
var DefaultDITG = DITG{N: 2, Duration: 2 * time.Second, TCPSize: 1024, TCPRate: 50000, UDPSize: 512, UDPRate: 1000,
	Interval: 200 * time.Millisecond}

// Flow is one D-ITG flow's ITGDec totals.
type Flow struct {
	Path  string `json:"path"`  // clusterip-v4, ...
	Proto string `json:"proto"` // TCP or UDP
	Dec   Totals `json:"itgdec"`
}

// Totals are the fields of ITGDec's summary the bench uses (seconds,
// bytes, Kbit/s as ITGDec prints them).
type Totals struct {
	Time      float64 `json:"total_time_s"`
	Packets   int     `json:"packets"`
	MinDelay  float64 `json:"min_delay_s"`
	MaxDelay  float64 `json:"max_delay_s"`
	AvgDelay  float64 `json:"avg_delay_s"`
	Jitter    float64 `json:"avg_jitter_s"`
	SDDelay   float64 `json:"delay_sd_s"`
	Bytes     int64   `json:"bytes"`
	Kbps      float64 `json:"avg_bitrate_kbps"`
	PktRate   float64 `json:"avg_pkt_rate"`
	Dropped   int     `json:"dropped"`
	ErrLines  int     `json:"error_lines"`
	FlowCount int     `json:"flows"`
}

// parseDecSummary reads ITGDec's summary from its standard output: the
// "TOTAL RESULTS" block if there is one, else the last per-flow block.
// Lines without "=" (banners, the progress spinner if stderr was mixed in)
// are skipped.
func parseDecSummary(r io.Reader) (Totals, error) {
	var t, cur Totals
	seen, total := false, false
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if strings.Contains(l, "TOTAL RESULTS") {
			cur, total = Totals{}, true
			continue
		}
		if strings.HasPrefix(strings.TrimSpace(l), "Flow number:") && !total {
			cur = Totals{FlowCount: 1}
			continue
		}
		k, v, ok := strings.Cut(l, "=")
		if !ok {
			continue
		}
		k = strings.TrimSpace(k)
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		// The spinner may precede a key when stderr is mixed in.
		if i := strings.LastIndexAny(k, `|\/`); i >= 0 {
			k = strings.TrimSpace(k[i+1:])
		}
		num, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			continue
		}
		switch k {
		case "Number of flows":
			cur.FlowCount = int(num)
		case "Total time":
			cur.Time = num
		case "Total packets":
			cur.Packets = int(num)
		case "Minimum delay":
			cur.MinDelay = num
		case "Maximum delay":
			cur.MaxDelay = num
		case "Average delay":
			cur.AvgDelay = num
		case "Average jitter":
			cur.Jitter = num
		case "Delay standard deviation":
			cur.SDDelay = num
		case "Bytes received":
			cur.Bytes = int64(num)
		case "Average bitrate":
			cur.Kbps = num
		case "Average packet rate":
			cur.PktRate = num
		case "Packets dropped":
			cur.Dropped = int(num)
		case "Error lines":
			cur.ErrLines = int(num)
		default:
			continue
		}
		seen = true
		t = cur
	}
	if err := sc.Err(); err != nil {
		return t, err
	}
	if !seen {
		return t, errors.New("ITGDec printed no summary")
	}
	return t, nil
}

// parseDecPackets reads ITGDec -l's per-packet text log and returns each
// packet's one-way delay in µs (rxTime - txTime; sender and receiver share
// this machine's clock). Times are hh:mm:ss.uuuuuu; a flow across midnight
// is unwrapped.
func parseDecPackets(r io.Reader) ([]float64, error) {
	var out []float64
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	n := 0
	for sc.Scan() {
		n++
		l := sc.Text()
		if strings.TrimSpace(l) == "" {
			continue
		}
		tx, ok1 := field(l, "txTime>")
		rx, ok2 := field(l, "rxTime>")
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("line %d: no txTime/rxTime: %q", n, l)
		}
		t1, err := clock(tx)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		t2, err := clock(rx)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		d := t2 - t1
		if d < -43200e6 { // rx after midnight
			d += 86400e6
		}
		out = append(out, d)
	}
	return out, sc.Err()
}

// field is the token after key (ITGDec pads values with spaces).
func field(l, key string) (string, bool) {
	i := strings.Index(l, key)
	if i < 0 {
		return "", false
	}
	f := strings.Fields(l[i+len(key):])
	if len(f) == 0 {
		return "", false
	}
	return f[0], true
}

// clock parses hh:mm:ss.uuuuuu into µs since midnight.
func clock(s string) (float64, error) {
	p := strings.Split(s, ":")
	if len(p) != 3 {
		return 0, fmt.Errorf("time %q: want hh:mm:ss.frac", s)
	}
	h, err1 := strconv.Atoi(p[0])
	m, err2 := strconv.Atoi(p[1])
	sec, err3 := strconv.ParseFloat(p[2], 64)
	if err := errors.Join(err1, err2, err3); err != nil {
		return 0, fmt.Errorf("time %q: %w", s, err)
	}
	return math.Round((float64(h*3600+m*60) + sec) * 1e6), nil
}

// parseDecBitrate reads ITGDec -b's file ("Time <flows...> Aggregate-Flow",
// then one row per interval, Kbit/s) and returns the aggregate column in
// Mbit/s. The last interval is cut short by the flow's end and is dropped.
func parseDecBitrate(r io.Reader) ([]float64, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	col := -1
	var out []float64
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		if f[0] == "Time" {
			for i, h := range f {
				if h == "Aggregate-Flow" {
					col = i
				}
			}
			continue
		}
		if col < 0 {
			return nil, errors.New("ITGDec bitrate file: no Aggregate-Flow header")
		}
		if col >= len(f) {
			return nil, fmt.Errorf("ITGDec bitrate file: short row %q", sc.Text())
		}
		v, err := strconv.ParseFloat(f[col], 64)
		if err != nil {
			return nil, fmt.Errorf("ITGDec bitrate file: %w", err)
		}
		out = append(out, v/1e3)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if col < 0 {
		return nil, errors.New("ITGDec bitrate file: empty")
	}
	if len(out) > 1 {
		out = out[:len(out)-1]
	}
	return out, nil
}

// ditgService is the D-ITG Service: NodePort, externalTrafficPolicy Local,
// dual-stack, TCP and UDP on ditgPort.
func ditgService() *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: ditgSvc, Namespace: namespace},
		Spec: corev1.ServiceSpec{
			Type:                  corev1.ServiceTypeNodePort,
			ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal,
			IPFamilyPolicy:        ptr.To(corev1.IPFamilyPolicyRequireDualStack),
			IPFamilies:            []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol},
			Ports: []corev1.ServicePort{
				{Name: "tcp", Port: ditgPort, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(ditgPort), NodePort: ditgPort},
				{Name: "udp", Port: ditgPort, Protocol: corev1.ProtocolUDP, TargetPort: intstr.FromInt32(ditgPort), NodePort: ditgPort},
			},
		}}
}

// createDITG writes the D-ITG Service and its two EndpointSlices (the
// receiver pod) and returns its ClusterIPs.
func createDITG(ctx context.Context, cs kubernetes.Interface, recv *multinode.Pod, node string) (v4, v6 string, err error) {
	s, err := cs.CoreV1().Services(namespace).Create(ctx, ditgService(), metav1.CreateOptions{})
	if err != nil {
		return "", "", fmt.Errorf("D-ITG service: %w", err)
	}
	if len(s.Spec.ClusterIPs) != 2 {
		return "", "", fmt.Errorf("D-ITG service: ClusterIPs %v", s.Spec.ClusterIPs)
	}
	for _, v6 := range []bool{false, true} {
		fam, at := "v4", discoveryv1.AddressTypeIPv4
		if v6 {
			fam, at = "v6", discoveryv1.AddressTypeIPv6
		}
		sl := &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Name: ditgSvc + "-" + fam, Namespace: namespace, Labels: map[string]string{
				discoveryv1.LabelServiceName: ditgSvc, discoveryv1.LabelManagedBy: "eztunnel-bench"}},
			AddressType: at,
			Ports: []discoveryv1.EndpointPort{
				{Name: ptr.To("tcp"), Port: ptr.To(int32(ditgPort)), Protocol: ptr.To(corev1.ProtocolTCP)},
				{Name: ptr.To("udp"), Port: ptr.To(int32(ditgPort)), Protocol: ptr.To(corev1.ProtocolUDP)},
			},
			Endpoints: []discoveryv1.Endpoint{{Addresses: []string{recv.Addr(v6).String()}, NodeName: ptr.To(node),
				Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)}}},
		}
		if _, err := cs.DiscoveryV1().EndpointSlices(namespace).Create(ctx, sl, metav1.CreateOptions{}); err != nil {
			return "", "", fmt.Errorf("D-ITG slice: %w", err)
		}
	}
	return s.Spec.ClusterIPs[0], s.Spec.ClusterIPs[1], nil
}

// extRoutes lets the external client reach the pod CIDRs through the node
// (D-ITG's signaling channel goes to the receiver pod directly). In the
// external netns, removed with it.
func extRoutes(ext *multinode.External, node *multinode.Node) error {
	for _, r := range []struct {
		dst netip.Prefix
		via netip.Addr
	}{{node.PodCIDRv4, node.UnderlayV4}, {node.PodCIDRv6, node.UnderlayV6}} {
		fam := "-4"
		if r.dst.Addr().Is6() {
			fam = "-6"
		}
		out, err := ext.Cmd(context.Background(), "ip", fam, "route", "replace", r.dst.String(), "via", r.via.String()).CombinedOutput()
		if err != nil {
			return fmt.Errorf("route %s via %s in %s: %w: %s", r.dst, r.via, ext.NetNS, err, out)
		}
	}
	return nil
}

// receiver is ITGRecv in the receiver pod, restarted if it exits (the
// paper saw it die at random).
type receiver struct {
	pod    *multinode.Pod
	dir    string
	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	out    *logbuf.Buffer
	starts int
}

func (r *receiver) ensure(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd != nil {
		select {
		case <-r.exited:
			r.cmd = nil
		default:
			return nil
		}
	}
	// Not the bench's ctx: stop() ends it, and Pdeathsig if the bench dies.
	// ITGRecv binds a flow's data socket to the destination address the
	// sender names (the NodePort's or ClusterIP's, absent in the pod) unless
	// -a says otherwise: "::" takes either family (v4-mapped).
	cmd := r.pod.Cmd(context.Background(), "ITGRecv", "-Sp", strconv.Itoa(ditgSigPort), "-a", "::")
	cmd.Dir = r.dir
	r.out = &logbuf.Buffer{}
	cmd.Stdout, cmd.Stderr = r.out, r.out
	if err := r.pod.Start(cmd); err != nil {
		return fmt.Errorf("ITGRecv: %w", err)
	}
	r.cmd, r.exited = cmd, make(chan struct{})
	ex := r.exited
	go func() { cmd.Wait(); close(ex) }()
	r.starts++
	// Listening on the signaling port.
	deadline := time.Now().Add(10 * time.Second)
	for {
		out, _ := r.pod.Cmd(ctx, "ss", "-Hltn", "sport", "= :"+strconv.Itoa(ditgSigPort)).Output()
		if strings.TrimSpace(string(out)) != "" {
			return nil
		}
		select {
		case <-ex:
			return fmt.Errorf("ITGRecv exited: %s", r.out.String())
		default:
		}
		if time.Now().After(deadline) {
			return errors.New("ITGRecv not listening after 10 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (r *receiver) output() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.out == nil {
		return ""
	}
	return r.out.String()
}

func (r *receiver) stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd == nil {
		return
	}
	r.cmd.Process.Kill()
	<-r.exited
	r.cmd = nil
}

// ditgFlow sends one flow from p to dst (data, through the datapath) with
// signaling to sig (the receiver pod), decodes the receiver's log and
// removes every log file. TCP: bitrate samples (Mbit/s per interval); UDP:
// per-packet one-way delays (µs). raw is ITGDec's summary as printed.
func ditgFlow(ctx context.Context, o DITG, wl workload.Client, p workload.Pod, recv *receiver, proto, dst, sig, dir string) (t Totals, samples []float64, raw string, err error) {
	if err := recv.ensure(ctx); err != nil {
		return Totals{}, nil, "", err
	}
	rlog := filepath.Join(dir, "itgrecv-"+proto+".log")
	slog := filepath.Join(dir, "itgsend-"+proto+".log")
	text := filepath.Join(dir, "itgdec-"+proto+".txt")
	defer os.Remove(rlog)
	defer os.Remove(slog)
	defer os.Remove(text)
	size, rate := o.UDPSize, o.UDPRate
	if proto == "TCP" {
		size, rate = o.TCPSize, o.TCPRate
	}
	cctx, cancel := context.WithTimeout(ctx, o.Duration+time.Minute)
	defer cancel()
	cmd := p.Cmd(cctx, "ITGSend", "-a", dst, "-rp", strconv.Itoa(ditgPort), "-Sda", sig, "-Sdp", strconv.Itoa(ditgSigPort),
		"-T", proto, "-c", strconv.Itoa(size), "-C", strconv.Itoa(rate), "-t", strconv.FormatInt(o.Duration.Milliseconds(), 10),
		"-l", slog, "-x", rlog)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := wl.Start(p, cmd); err != nil {
		return Totals{}, nil, "", fmt.Errorf("ITGSend: %w", err)
	}
	if err := cmd.Wait(); err != nil {
		return Totals{}, nil, "", fmt.Errorf("ITGSend %s to %s: %w: %s", proto, dst, err, tailOf(out.String(), 10))
	}
	if strings.Contains(out.String(), "rror") {
		return Totals{}, nil, "", fmt.Errorf("ITGSend %s to %s: %s", proto, dst, tailOf(out.String(), 10))
	}
	// The receiver closes its log when the sender's end message arrives;
	// give it a moment if ITGSend returned first.
	for try := 0; ; try++ {
		t, raw, err = decode(ctx, rlog)
		if err == nil && t.Packets > 0 || try == 20 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil || t.Packets == 0 {
		size := "missing"
		if fi, serr := os.Stat(rlog); serr == nil {
			size = strconv.FormatInt(fi.Size(), 10) + " bytes"
		}
		return t, nil, raw, fmt.Errorf("%s flow to %s: the receiver logged no packet (%v; receiver log %s)\nITGSend: %s\nITGRecv: %s",
			proto, dst, err, size, tailOf(out.String(), 8), tailOf(recv.output(), 8))
	}
	// TCP: bitrate per interval (-b); UDP: each packet's delay (-l).
	opts, parse := []string{"-l", text}, parseDecPackets
	if proto == "TCP" {
		opts, parse = []string{"-b", strconv.FormatInt(o.Interval.Milliseconds(), 10), text}, parseDecBitrate
	}
	if err := decodeTo(ctx, rlog, opts); err != nil {
		return t, nil, raw, err
	}
	f, err := os.Open(text)
	if err != nil {
		return t, nil, raw, err
	}
	defer f.Close()
	if samples, err = parse(f); err != nil {
		return t, nil, raw, err
	}
	return t, samples, raw, nil
}

// decodeTo runs ITGDec on a receiver log with an output option (-b, -l):
// it then prints no summary, only its banner.
func decodeTo(ctx context.Context, log string, extra []string) error {
	cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if out, err := sysexec.Command(cctx, "ITGDec", append([]string{log}, extra...)...).Output(); err != nil {
		return fmt.Errorf("ITGDec %s %v: %w: %s", log, extra, err, out)
	}
	return nil
}

// decode runs ITGDec on a receiver log (its spinner goes to stderr, which
// is dropped) and parses the summary.
func decode(ctx context.Context, log string) (Totals, string, error) {
	cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := sysexec.Command(cctx, "ITGDec", log)
	out, err := cmd.Output()
	if err != nil {
		return Totals{}, string(out), fmt.Errorf("ITGDec %s: %w", log, err)
	}
	t, err := parseDecSummary(strings.NewReader(string(out)))
	return t, string(out), err
}

// ditgEnv: the receiver and the D-ITG Service's ClusterIPs.
type ditgEnv struct {
	recv   *receiver
	v4, v6 string
}

// DITGPaths in the order a step runs them.
var DITGPaths = []string{"nodeport-v4", "nodeport-v6", "clusterip-v4", "clusterip-v6"}

// runDITG runs o.DITG.N rounds of a TCP and a UDP flow on every path. A
// failed flow is retried once (counted in DITGFails); a second failure
// ends the run.
func runDITG(ctx context.Context, o Options, wl workload.Client, client *multinode.Pod, ext *multinode.External, node *multinode.Node,
	recvPod *multinode.Pod, de *ditgEnv, dp string, nodePortEZ bool, tmp string, st *Step) error {
	var rawDir string
	if o.Out != "" {
		rawDir = filepath.Join(o.Out, "itgdec")
		if err := os.MkdirAll(rawDir, 0o755); err != nil {
			return err
		}
	}
	for rep := range o.DITG.N {
		for _, path := range DITGPaths {
			v6 := strings.HasSuffix(path, "v6")
			var p workload.Pod = client
			dst := de.v4
			if v6 {
				dst = de.v6
			}
			if strings.HasPrefix(path, "nodeport") {
				if dp == Eztunnel && !nodePortEZ {
					continue
				}
				p, dst = ext, node.UnderlayV4.String()
				if v6 {
					dst = node.UnderlayV6.String()
				}
			}
			sig := recvPod.Addr(v6).String()
			for _, proto := range []string{"TCP", "UDP"} {
				t, samples, raw, err := ditgFlow(ctx, o.DITG, wl, p, de.recv, proto, dst, sig, tmp)
				if err != nil {
					st.DITGFails[path+"/"+proto]++
					o.logf("%s at %d Services: D-ITG %s %s failed, retrying once: %v", dp, st.Count, path, proto, err)
					time.Sleep(2 * time.Second)
					t, samples, raw, err = ditgFlow(ctx, o.DITG, wl, p, de.recv, proto, dst, sig, tmp)
					if err != nil {
						return fmt.Errorf("D-ITG %s %s: %w", path, proto, err)
					}
				}
				st.Flows = append(st.Flows, Flow{Path: path, Proto: proto, Dec: t})
				if rawDir != "" {
					// ITGDec's summary as printed, for the record.
					f := filepath.Join(rawDir, fmt.Sprintf("%s-%d-%s-%s-%d.txt", dp, st.Count, path, proto, rep))
					if err := os.WriteFile(f, []byte(raw), 0o644); err != nil {
						return err
					}
				}
				if proto == "TCP" {
					st.Throughput[path] = append(st.Throughput[path], samples...)
				} else {
					st.UDPDelay[path] = append(st.UDPDelay[path], samples...)
				}
			}
		}
	}
	o.logf("%s at %d Services: D-ITG nodeport-v4 TCP mean %.0f Mbit/s, UDP delay p50 %.0f µs", dp, st.Count,
		meanOf(st.Throughput["nodeport-v4"]), p50Of(st.UDPDelay["nodeport-v4"]))
	return nil
}
