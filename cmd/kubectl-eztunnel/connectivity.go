package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/eztunnel/eztunnel/internal/cli"
	"github.com/eztunnel/eztunnel/internal/kube"
	"github.com/eztunnel/eztunnel/internal/probe"
)

// connectivityReport is `kubectl eztunnel connectivity -o json`.
type connectivityReport struct {
	Image   string     `json:"image"`
	Nodes   []string   `json:"nodes"`
	Cases   []connCase `json:"cases"`
	Skipped []string   `json:"skipped,omitempty"`
	Passed  bool       `json:"passed"`
	Cleaned bool       `json:"cleaned"` // the test namespaces are gone
}

// connCase is one client pod's checks: a namespace the agent selects or
// not, on the server's node or another, to the server pod and to its
// Service.
type connCase struct {
	Name            string         `json:"name"`
	Namespace       string         `json:"namespace"`
	ClientNode      string         `json:"client_node"`
	ServerNode      string         `json:"server_node"`
	WantAccelerated bool           `json:"want_accelerated"`
	Results         []probe.Result `json:"results"`
	Error           string         `json:"error,omitempty"`
	Passed          bool           `json:"passed"`
}

type connectivityOptions struct {
	agents
	output  string
	timeout time.Duration
}

func connectivityCmd() *cobra.Command {
	var o connectivityOptions
	cmd := &cobra.Command{
		Use:   "connectivity",
		Short: "Run test pods (the agent's image) in two new namespaces, one the agent selects: same-node pairs there must take the shortcut, the others must not, every byte checked; everything is removed after",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := cli.CheckOutput(o.output); err != nil {
				return err
			}
			// Ctrl-C still removes the namespaces (the run's context ends,
			// the removal has its own).
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			rep, err := o.run(ctx, cmd.ErrOrStderr())
			if rep != nil {
				if rerr := cli.Render(o.output, rep, func() { printConnectivity(cmd.OutOrStdout(), rep) }); rerr != nil && err == nil {
					err = rerr
				}
			}
			if err == nil && !rep.Passed {
				err = errors.New("connectivity test failed")
			}
			return err
		},
	}
	f := cmd.Flags()
	o.agents.register(f)
	f.DurationVar(&o.timeout, "timeout", 3*time.Minute, "how long the test pods may take to start and finish")
	cli.OutputFlag(cmd, &o.output)
	return cmd
}

// run creates the test namespaces, runs the cases and removes them.
func (o connectivityOptions) run(ctx context.Context, log io.Writer) (rep *connectivityReport, err error) {
	_, kc, err := clients(o.kubeconfig)
	if err != nil {
		return nil, err
	}
	image, nodes, err := o.imageAndNodes(ctx, kc)
	if err != nil {
		return nil, err
	}
	rep = &connectivityReport{Image: image, Nodes: nodes}
	suffix := fmt.Sprintf("%05x", rand.Uint32()&0xfffff)
	on, off := "eztunnel-ct-"+suffix+"-on", "eztunnel-ct-"+suffix+"-off"
	defer func() {
		// Removed even when ctx ended (Ctrl-C): a fresh context.
		rctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cerr := removeNamespaces(rctx, kc, on, off)
		rep.Cleaned = cerr == nil
		err = errors.Join(err, cerr)
	}()
	fmt.Fprintf(log, "connectivity: image %s, nodes %s, namespaces %s (selected) and %s\n", image, strings.Join(nodes, ","), on, off)
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	for ns, selected := range map[string]bool{on: true, off: false} {
		if err := createServer(ctx, kc, ns, selected, image, nodes[0]); err != nil {
			return rep, err
		}
	}
	clientNodes := []string{nodes[0]}
	if len(nodes) > 1 {
		clientNodes = append(clientNodes, nodes[1])
	} else {
		rep.Skipped = append(rep.Skipped, "cross-node: the cluster has one node with an agent")
	}
	for _, ns := range []string{on, off} {
		for _, node := range clientNodes {
			c := connCase{Namespace: ns, ClientNode: node, ServerNode: nodes[0], WantAccelerated: ns == on && node == nodes[0]}
			c.Name = map[bool]string{true: "selected", false: "unselected"}[ns == on] + ", " + map[bool]string{true: "same node", false: "cross-node"}[node == nodes[0]]
			rep.Cases = append(rep.Cases, runCase(ctx, kc, c, image))
		}
	}
	rep.Passed = !slices.ContainsFunc(rep.Cases, func(c connCase) bool { return !c.Passed })
	return rep, nil
}

// imageAndNodes reads the agent pods: their image, and the nodes where
// one runs (sorted).
func (a agents) imageAndNodes(ctx context.Context, kc kubernetes.Interface) (string, []string, error) {
	pods, err := a.list(ctx, kc)
	if err != nil {
		return "", nil, err
	}
	image := ""
	var nodes []string
	for _, p := range pods {
		if p.Status.Phase != corev1.PodRunning || len(p.Spec.Containers) == 0 {
			continue
		}
		image = p.Spec.Containers[0].Image
		nodes = append(nodes, p.Spec.NodeName)
	}
	if len(nodes) == 0 {
		return "", nil, fmt.Errorf("no running agent pods in namespace %s with labels %s: is the chart installed there?", a.namespace, a.selector)
	}
	slices.Sort(nodes)
	return image, nodes, nil
}

// testPod is a pod of the agent's image running `eztunnel probe args`,
// unprivileged, on node.
func testPod(ns, name, image, node string, restart corev1.RestartPolicy, args ...string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": name}},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			RestartPolicy:                 restart,
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			SecurityContext:               &corev1.PodSecurityContext{RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](65534)},
			Containers: []corev1.Container{{
				Name: "probe", Image: image, ImagePullPolicy: corev1.PullIfNotPresent,
				Command: append([]string{"/eztunnel", "probe"}, args...),
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: ptr.To(false), ReadOnlyRootFilesystem: ptr.To(true),
					Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
			}},
		},
	}
}

// createServer makes the namespace (labelled for the agent when selected),
// the echo server on node and its Service, and waits until it is ready.
func createServer(ctx context.Context, kc kubernetes.Interface, ns string, selected bool, image, node string) error {
	nso := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{"app.kubernetes.io/part-of": "eztunnel-connectivity"}}}
	if selected {
		nso.Labels[kube.Key] = "enabled"
	}
	if _, err := kc.CoreV1().Namespaces().Create(ctx, nso, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create namespace %s: %w", ns, err)
	}
	srv := testPod(ns, "server", image, node, corev1.RestartPolicyAlways, "serve", "--addr", ":7070")
	srv.Spec.Containers[0].ReadinessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(7070)}}, PeriodSeconds: 1}
	if _, err := kc.CoreV1().Pods(ns).Create(ctx, srv, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create the server in %s: %w", ns, err)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "server", Namespace: ns},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "server"},
			Ports: []corev1.ServicePort{{Name: "echo", Port: 80, TargetPort: intstr.FromInt32(7070)}}},
	}
	if _, err := kc.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create the server's Service in %s: %w", ns, err)
	}
	for {
		p, err := kc.CoreV1().Pods(ns).Get(ctx, "server", metav1.GetOptions{})
		if err == nil && slices.ContainsFunc(p.Status.Conditions, func(c corev1.PodCondition) bool {
			return c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue
		}) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the server in %s is not ready: %w", ns, ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// runCase runs a client pod checking the server pod and its Service, and
// judges its results.
func runCase(ctx context.Context, kc kubernetes.Interface, c connCase, image string) connCase {
	fail := func(err error) connCase { c.Error = err.Error(); return c }
	srv, err := kc.CoreV1().Pods(c.Namespace).Get(ctx, "server", metav1.GetOptions{})
	if err != nil {
		return fail(err)
	}
	svc, err := kc.CoreV1().Services(c.Namespace).Get(ctx, "server", metav1.GetOptions{})
	if err != nil {
		return fail(err)
	}
	name := "client-" + strings.ToLower(strings.ReplaceAll(c.ClientNode, ".", "-"))
	if len(name) > 63 {
		name = name[:63]
	}
	cl := testPod(c.Namespace, name, image, c.ClientNode, corev1.RestartPolicyNever,
		"check", "--addr", srv.Status.PodIP+":7070", "--addr", svc.Spec.ClusterIP+":80", "--conns", "4", "--bytes", "1048576")
	if _, err := kc.CoreV1().Pods(c.Namespace).Create(ctx, cl, metav1.CreateOptions{}); err != nil {
		return fail(fmt.Errorf("create the client: %w", err))
	}
	for {
		p, err := kc.CoreV1().Pods(c.Namespace).Get(ctx, name, metav1.GetOptions{})
		if err == nil && (p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed) {
			break
		}
		select {
		case <-ctx.Done():
			return fail(fmt.Errorf("the client did not finish: %w", ctx.Err()))
		case <-time.After(500 * time.Millisecond):
		}
	}
	out, err := kc.CoreV1().Pods(c.Namespace).GetLogs(name, &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil {
		return fail(fmt.Errorf("the client's output: %w", err))
	}
	if err := json.Unmarshal(out, &c.Results); err != nil || len(c.Results) == 0 {
		return fail(fmt.Errorf("the client's output %q: %v", out, err))
	}
	c.Passed = !slices.ContainsFunc(c.Results, func(r probe.Result) bool {
		return !r.Exact || r.Error != "" || r.Accelerated != c.WantAccelerated
	})
	return c
}

// removeNamespaces deletes the test namespaces and waits until they are gone.
func removeNamespaces(ctx context.Context, kc kubernetes.Interface, names ...string) error {
	var errs []error
	for _, ns := range names {
		err := kc.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete namespace %s: %w", ns, err))
		}
	}
	for _, ns := range names {
		for !gone(ctx, kc, ns) {
			if ctx.Err() != nil {
				errs = append(errs, fmt.Errorf("namespace %s still there: %w", ns, ctx.Err()))
				break
			}
			time.Sleep(time.Second)
		}
	}
	return errors.Join(errs...)
}

func gone(ctx context.Context, kc kubernetes.Interface, ns string) bool {
	_, err := kc.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
	return apierrors.IsNotFound(err)
}

func printConnectivity(out io.Writer, rep *connectivityReport) {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "CASE\tCLIENT NODE\tCONNECTIONS\tEXACT\tACCELERATED\tWANT\tRESULT")
	for _, c := range rep.Cases {
		exact, acc := 0, 0
		for _, r := range c.Results {
			if r.Exact {
				exact++
			}
			if r.Accelerated {
				acc++
			}
		}
		res := map[bool]string{true: "pass", false: "FAIL"}[c.Passed]
		if c.Error != "" {
			res = "FAIL: " + c.Error
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%d\t%v\t%s\n", c.Name, c.ClientNode, len(c.Results), exact, acc, c.WantAccelerated, res)
	}
	w.Flush()
	for _, s := range rep.Skipped {
		fmt.Fprintf(out, "skipped: %s\n", s)
	}
	fmt.Fprintf(out, "test namespaces removed: %v\n", rep.Cleaned)
}
